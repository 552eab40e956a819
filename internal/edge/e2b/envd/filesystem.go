package envd

import (
	"context"
	"errors"
	"os"
	"path"
	"strings"
	"sync"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/core/sandbox"
	pb "github.com/amber-run/amber/internal/edge/e2b/envdpb/filesystem"
)

// filesystemService is envd's filesystem.Filesystem on the engine's
// sandbox FS (engine.Files) and its file watch (engine.WatchFiles).
type filesystemService struct{ *service }

// maxListDepth bounds ListDir's depth; maxListEntries its answer.
const (
	maxListDepth   = 64
	maxListEntries = 100000
)

// fs is the call's sandbox filesystem and p checked as an absolute path.
func (s *service) fs(ctx context.Context, p string) (sandbox.FS, string, error) {
	p, err := absPath(p)
	if err != nil {
		return nil, "", err
	}
	c := callOf(ctx)
	fsys, err := s.eng.Files(ctx, c.tenant, c.id)
	if err != nil {
		return nil, "", err
	}
	return fsys, p, nil
}

// entry is fi, found at p, as envd's EntryInfo: mode the permission bits,
// permissions their ls spelling. The owner and group are not known from
// the host's view (left empty).
func entry(p string, fi sandbox.FileInfo) *pb.EntryInfo {
	typ := pb.FileType_FILE_TYPE_UNSPECIFIED
	switch {
	case fi.Mode&os.ModeSymlink != 0:
		typ = pb.FileType_FILE_TYPE_SYMLINK
	case fi.Mode.IsDir():
		typ = pb.FileType_FILE_TYPE_DIRECTORY
	case fi.Mode.IsRegular():
		typ = pb.FileType_FILE_TYPE_FILE
	}
	name := fi.Name
	if name == "" {
		name = path.Base(p)
	}
	e := &pb.EntryInfo{Name: name, Type: typ, Path: p, Size: fi.Size, Mode: uint32(fi.Mode.Perm()),
		Permissions: fi.Mode.String(), ModifiedTime: timestamppb.New(fi.ModTime)}
	if fi.Link != "" {
		e.SymlinkTarget = &fi.Link
	}
	return e
}

func (s *filesystemService) Stat(ctx context.Context, req *connect.Request[pb.StatRequest]) (*connect.Response[pb.StatResponse], error) {
	fsys, p, err := s.fs(ctx, req.Msg.GetPath())
	if err != nil {
		return nil, connectErr(err)
	}
	fi, err := fsys.Stat(ctx, p)
	if err != nil {
		return nil, connectErr(err)
	}
	return connect.NewResponse(&pb.StatResponse{Entry: entry(p, fi)}), nil
}

// MakeDir makes the directory and its missing parents; one that exists
// is AlreadyExists (the SDK's makeDir then answers false).
func (s *filesystemService) MakeDir(ctx context.Context, req *connect.Request[pb.MakeDirRequest]) (*connect.Response[pb.MakeDirResponse], error) {
	fsys, p, err := s.fs(ctx, req.Msg.GetPath())
	if err != nil {
		return nil, connectErr(err)
	}
	if fi, err := fsys.Stat(ctx, p); err == nil {
		if fi.Mode.IsDir() {
			return nil, connect.NewError(connect.CodeAlreadyExists, errors.New("directory "+p+" exists already"))
		}
		return nil, connect.NewError(connect.CodeAlreadyExists, errors.New(p+" exists already and is not a directory"))
	} else if !errdefs.IsNotFound(err) {
		return nil, connectErr(err)
	}
	if err := fsys.Mkdir(ctx, p, 0o755); err != nil {
		return nil, connectErr(err)
	}
	fi, err := fsys.Stat(ctx, p)
	if err != nil {
		return nil, connectErr(err)
	}
	return connect.NewResponse(&pb.MakeDirResponse{Entry: entry(p, fi)}), nil
}

func (s *filesystemService) Move(ctx context.Context, req *connect.Request[pb.MoveRequest]) (*connect.Response[pb.MoveResponse], error) {
	fsys, from, err := s.fs(ctx, req.Msg.GetSource())
	if err != nil {
		return nil, connectErr(err)
	}
	to, err := absPath(req.Msg.GetDestination())
	if err != nil {
		return nil, connectErr(err)
	}
	if err := fsys.Rename(ctx, from, to); err != nil {
		return nil, connectErr(err)
	}
	fi, err := fsys.Stat(ctx, to)
	if err != nil {
		return nil, connectErr(err)
	}
	return connect.NewResponse(&pb.MoveResponse{Entry: entry(to, fi)}), nil
}

// ListDir lists a directory, and (depth > 1) the directories below it to
// that depth; depth 0 is 1, as the SDK's default.
func (s *filesystemService) ListDir(ctx context.Context, req *connect.Request[pb.ListDirRequest]) (*connect.Response[pb.ListDirResponse], error) {
	fsys, p, err := s.fs(ctx, req.Msg.GetPath())
	if err != nil {
		return nil, connectErr(err)
	}
	depth := int(req.Msg.GetDepth())
	if depth == 0 {
		depth = 1
	}
	if depth > maxListDepth {
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("depth is larger than 64"))
	}
	fi, err := fsys.Stat(ctx, p)
	if err != nil {
		return nil, connectErr(err)
	}
	if !fi.Mode.IsDir() {
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New(p+" is not a directory"))
	}
	out := &pb.ListDirResponse{}
	if err := list(ctx, fsys, p, depth, out); err != nil {
		return nil, connectErr(err)
	}
	return connect.NewResponse(out), nil
}

func list(ctx context.Context, fsys sandbox.FS, dir string, depth int, out *pb.ListDirResponse) error {
	ents, err := fsys.List(ctx, dir)
	if err != nil {
		return err
	}
	for _, e := range ents {
		p := path.Join(dir, e.Name)
		out.Entries = append(out.Entries, entry(p, e))
		if len(out.Entries) > maxListEntries {
			return errdefs.ResourceExhaustedf("the listing of %s holds more than %d entries: list with a smaller depth", dir, maxListEntries)
		}
		if depth > 1 && e.Mode.IsDir() {
			if err := list(ctx, fsys, p, depth-1, out); err != nil {
				return err
			}
		}
	}
	return nil
}

// Remove removes a file or a directory with everything in it.
func (s *filesystemService) Remove(ctx context.Context, req *connect.Request[pb.RemoveRequest]) (*connect.Response[pb.RemoveResponse], error) {
	fsys, p, err := s.fs(ctx, req.Msg.GetPath())
	if err != nil {
		return nil, connectErr(err)
	}
	if p == "/" {
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("refusing to remove /"))
	}
	if err := fsys.Remove(ctx, p, true); err != nil {
		return nil, connectErr(err)
	}
	return connect.NewResponse(&pb.RemoveResponse{}), nil
}

var eventTypes = map[string]pb.EventType{
	"create": pb.EventType_EVENT_TYPE_CREATE, "write": pb.EventType_EVENT_TYPE_WRITE, "remove": pb.EventType_EVENT_TYPE_REMOVE,
	"rename": pb.EventType_EVENT_TYPE_RENAME, "chmod": pb.EventType_EVENT_TYPE_CHMOD,
}

// fsEvent is a change under dir as envd's event: its name is the path
// relative to the watched directory. An overflow has no envd form (nil).
func fsEvent(ctx context.Context, fsys sandbox.FS, dir string, e sandbox.WatchEvent, withEntry bool) *pb.FilesystemEvent {
	typ, ok := eventTypes[e.Op]
	if !ok {
		return nil
	}
	name := strings.TrimPrefix(strings.TrimPrefix(e.Path, dir), "/")
	if name == "" {
		name = path.Base(e.Path)
	}
	ev := &pb.FilesystemEvent{Name: name, Type: typ}
	if withEntry && fsys != nil && typ != pb.EventType_EVENT_TYPE_REMOVE {
		if fi, err := fsys.Stat(ctx, e.Path); err == nil {
			ev.Entry = entry(e.Path, fi)
		}
	}
	return ev
}

// watch starts a watch of the call's sandbox under p; fn gets each event.
// ready is closed once the watch is in place.
func (s *service) watch(ctx context.Context, p string, recursive, withEntry bool, ready chan<- struct{}, fn func(*pb.FilesystemEvent) error) error {
	c := callOf(ctx)
	fsys, p, err := s.fs(ctx, p)
	if err != nil {
		return err
	}
	fi, err := fsys.Stat(ctx, p)
	if err != nil {
		return err
	}
	if !fi.Mode.IsDir() {
		return errdefs.InvalidArgumentf("%s is not a directory", p)
	}
	return s.eng.WatchFiles(ctx, c.tenant, c.id, p, recursive, ready, func(e sandbox.WatchEvent) error {
		if ev := fsEvent(ctx, fsys, p, e, withEntry); ev != nil {
			return fn(ev)
		}
		return nil
	})
}

// WatchDir streams the changes under a directory: a start event once the
// watch is in place, then each change, with keepalives when quiet.
func (s *filesystemService) WatchDir(ctx context.Context, req *connect.Request[pb.WatchDirRequest], st *connect.ServerStream[pb.WatchDirResponse]) error {
	ctx, end, err := s.beginStream(ctx)
	if err != nil {
		return err
	}
	defer end()
	out := newSender(st.Send)
	defer out.stop()
	// The start event goes once the watch is in place, or before the
	// first change, whichever comes first.
	var once sync.Once
	var startErr error
	start := func() {
		once.Do(func() {
			startErr = out.send(&pb.WatchDirResponse{Event: &pb.WatchDirResponse_Start{Start: &pb.WatchDirResponse_StartEvent{}}})
			out.keepalive(ctx, keepalive(req.Header()), func() *pb.WatchDirResponse {
				return &pb.WatchDirResponse{Event: &pb.WatchDirResponse_Keepalive{Keepalive: &pb.WatchDirResponse_KeepAlive{}}}
			})
		})
	}
	ready := make(chan struct{})
	go func() {
		select {
		case <-ready:
			start()
		case <-ctx.Done():
		case <-out.done:
		}
	}()
	m := req.Msg
	err = s.watch(ctx, m.GetPath(), m.GetRecursive(), m.GetIncludeEntry(), ready, func(ev *pb.FilesystemEvent) error {
		start()
		if startErr != nil {
			return startErr
		}
		return out.send(&pb.WatchDirResponse{Event: &pb.WatchDirResponse_Filesystem{Filesystem: ev}})
	})
	return streamEnd(ctx, err) // the client going away is the end of a watch
}
