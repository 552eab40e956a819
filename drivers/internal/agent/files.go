package agent

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"path"
	"strconv"
	"time"

	"github.com/amber-run/amber/core/errdefs"
	"github.com/amber-run/amber/core/sandbox"
	"github.com/amber-run/amber/lib/agentproto"
)

// DefaultMaxRead bounds one ReadFile through the agent when FS.MaxRead is
// zero: the agent refuses a larger file, and the client stops reading an
// answer that goes on past it (a hostile agent's endless stream).
const DefaultMaxRead = 16 << 30

// ServesFiles says whether the agent serves the file calls (protocol 1.1
// and later). The answer is asked of the agent once per connection
// generation (Drop forgets it: a restore may bring back an agent of an
// older build).
func (c *Client) ServesFiles(ctx context.Context) (bool, error) {
	c.mu.Lock()
	v := c.protocol
	c.mu.Unlock()
	if v == "" {
		h, err := c.Health(ctx)
		if err != nil {
			return false, err
		}
		v = h.Protocol
	}
	return agentproto.HasFiles(v), nil
}

// ReadFile copies the regular file at p to w; a file larger than max is
// ErrTooLarge. A stream that breaks off is an error, never a short file.
func (c *Client) ReadFile(ctx context.Context, p string, max int64, w io.Writer) error {
	if max <= 0 {
		max = DefaultMaxRead
	}
	q := url.Values{"path": {p}, "max": {strconv.FormatInt(max, 10)}}
	resp, err := c.do(ctx, "GET", "/v1/files", q, nil)
	if err != nil {
		return fileError(err)
	}
	defer resp.Body.Close()
	n, err := io.Copy(writerOnly{w}, io.LimitReader(resp.Body, max+1))
	var we writeErr
	switch {
	case errors.As(err, &we):
		return we.err
	case err != nil:
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return c.unavailable(fmt.Errorf("read %q: %v", p, err))
	case n > max:
		return errdefs.TooLargef("sandbox %s: read %q: more than %d bytes", c.id, p, max)
	}
	return nil
}

// writerOnly marks the caller's write errors, to tell them from the
// agent's.
type writerOnly struct{ w io.Writer }

type writeErr struct{ err error }

func (e writeErr) Error() string { return e.err.Error() }

func (o writerOnly) Write(b []byte) (int, error) {
	n, err := o.w.Write(b)
	if err != nil {
		return n, writeErr{err}
	}
	return n, nil
}

// countingReader remembers how much was read of r and its error.
type countingReader struct {
	r   io.Reader
	n   int64
	err error
}

func (c *countingReader) Read(b []byte) (int, error) {
	n, err := c.r.Read(b)
	c.n += int64(n)
	if err != nil && err != io.EOF {
		c.err = err
	}
	return n, err
}

// WriteFile replaces the file at p with r's content, atomically (the agent
// writes a temporary file, fsyncs it and renames it over p). An error of r
// is returned as it is; the file is then unchanged.
func (c *Client) WriteFile(ctx context.Context, p string, r io.Reader, mode os.FileMode) error {
	_, err := c.writeFile(ctx, p, r, mode)
	return err
}

func (c *Client) writeFile(ctx context.Context, p string, r io.Reader, mode os.FileMode) (read int64, err error) {
	body := &countingReader{r: r}
	q := url.Values{"path": {p}, "mode": {strconv.FormatUint(uint64(mode), 10)}}
	resp, err := c.do(ctx, "PUT", "/v1/files", q, body)
	if body.err != nil {
		return body.n, body.err
	}
	if err != nil {
		return body.n, fileError(err)
	}
	resp.Body.Close()
	return body.n, nil
}

// Stat describes p (lstat).
func (c *Client) Stat(ctx context.Context, p string) (agentproto.FileInfo, error) {
	var fi agentproto.FileInfo
	if err := c.call(ctx, "GET", "/v1/files/stat?"+url.Values{"path": {p}}.Encode(), nil, &fi); err != nil {
		return fi, fileError(err)
	}
	want := "/"
	if cp, err := agentproto.CleanPath(p); err == nil && cp != "/" {
		want = path.Base(cp)
	}
	if err := fi.Check(want); err != nil {
		return agentproto.FileInfo{}, c.unavailable(fmt.Errorf("bad answer to stat: %v", err))
	}
	return fi, nil
}

// List describes the entries of the directory p, sorted by name.
func (c *Client) List(ctx context.Context, p string) ([]agentproto.FileInfo, error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, 10*CallTimeout)
		defer cancel()
	}
	resp, err := c.do(ctx, "GET", "/v1/files/list", url.Values{"path": {p}}, nil)
	if err != nil {
		return nil, fileError(err)
	}
	defer resp.Body.Close()
	out, err := DecodeList(resp.Body)
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, c.unavailable(fmt.Errorf("list %q: %v", p, err))
	}
	return out, nil
}

// DecodeList reads a listing as the agent streams it: one FileInfo per
// line, each line at most agentproto.MaxJSON, at most
// agentproto.MaxListEntries entries, each a valid name, in strictly
// increasing order (so no name twice).
func DecodeList(r io.Reader) ([]agentproto.FileInfo, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 4096), agentproto.MaxJSON)
	var out []agentproto.FileInfo
	for sc.Scan() {
		if len(out) >= agentproto.MaxListEntries {
			return nil, fmt.Errorf("more than %d entries", agentproto.MaxListEntries)
		}
		var fi agentproto.FileInfo
		if err := json.Unmarshal(sc.Bytes(), &fi); err != nil {
			return nil, fmt.Errorf("entry %d: %v", len(out), err)
		}
		if err := fi.Check(""); err != nil {
			return nil, fmt.Errorf("entry %d: %v", len(out), err)
		}
		if len(out) > 0 && fi.Name <= out[len(out)-1].Name {
			return nil, fmt.Errorf("entry %d: %q out of order", len(out), fi.Name)
		}
		out = append(out, fi)
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	return out, nil
}

// FileError is a file call the agent refused, as the agent explained it:
// the message names the sandbox path and the errno ("read \"/x\": no
// such file or directory"), as the host-side confinedfs's errors do, and
// errors.Is matches its kind (errdefs.ErrNotFound, …).
type FileError struct {
	Msg  string
	kind error
}

func (e *FileError) Error() string { return e.Msg }
func (e *FileError) Unwrap() error { return e.kind }

// fileError turns the agent's refusal of a file call into a *FileError;
// other errors (the agent unavailable, a bad answer) pass through.
func fileError(err error) error {
	var ae *Error
	if err == nil || !errors.As(err, &ae) {
		return err
	}
	kind := map[string]error{
		"not_found": errdefs.ErrNotFound, "invalid": errdefs.ErrInvalidArgument, "denied": errdefs.ErrPermissionDenied,
		"exists": errdefs.ErrAlreadyExists, "precondition": errdefs.ErrFailedPrecondition,
		"exhausted": errdefs.ErrResourceExhausted, "too_large": errdefs.ErrTooLarge,
	}[ae.Code]
	if kind == nil {
		return err
	}
	return &FileError{Msg: ae.Message, kind: kind}
}

// Mkdir makes the directory p and its missing parents with mode.
func (c *Client) Mkdir(ctx context.Context, p string, mode os.FileMode) error {
	return fileError(c.call(ctx, "POST", "/v1/files/mkdir", agentproto.Mkdir{Path: p, Mode: uint32(mode)}, nil))
}

// Rename renames from to to, as rename(2).
func (c *Client) Rename(ctx context.Context, from, to string) error {
	return fileError(c.call(ctx, "POST", "/v1/files/rename", agentproto.Rename{From: from, To: to}, nil))
}

// Remove removes p (recursive: a directory and everything in it).
func (c *Client) Remove(ctx context.Context, p string, recursive bool) error {
	ctx, cancel := ctx, context.CancelFunc(func() {})
	if _, ok := ctx.Deadline(); !ok && recursive {
		ctx, cancel = context.WithTimeout(ctx, 20*CallTimeout) // a big tree takes a while
	}
	defer cancel()
	return fileError(c.call(ctx, "POST", "/v1/files/remove", agentproto.Remove{Path: p, Recursive: recursive}, nil))
}

// FS is a sandbox's filesystem (core/sandbox.FS) served by its agent, in
// the sandbox's own mount namespace — what its processes see, tmpfs mounts
// included — with a host-side FS (the driver's confinedfs over the layer)
// for what the agent cannot serve:
//
//   - a sandbox that does not run (Agent answers nil, or a call finds the
//     agent unavailable and the client's Alive says the sandbox stopped):
//     its layer is still there;
//   - an agent without the file calls (protocol 1.0, an agent build a
//     checkpoint made before them recorded and a restore brought back);
//   - TarOut and TarIn, which stay host-side.
//
// The fallback never changes what a call means: both implement the same
// contract. A WriteFile whose body was partly sent when the agent went away
// is not retried on the host (its reader is spent): the error is returned
// and, the write being atomic, the file is unchanged.
type FS struct {
	// Agent returns the client of the sandbox's agent, or nil when the
	// sandbox has none that runs.
	Agent func(ctx context.Context) *Client
	// Host serves what the agent does not.
	Host sandbox.FS
	// MaxRead bounds ReadFile (0: DefaultMaxRead).
	MaxRead int64
}

var _ sandbox.FS = (*FS)(nil)

// client returns the agent's client for a file call, or nil: use Host.
func (f *FS) client(ctx context.Context) (*Client, error) {
	c := f.Agent(ctx)
	if c == nil {
		return nil, nil
	}
	ok, err := c.ServesFiles(ctx)
	if err != nil {
		if f.stopped(ctx, c, err) {
			return nil, nil
		}
		return nil, err
	}
	if !ok {
		return nil, nil
	}
	return c, nil
}

// stopped says whether err, from the agent, means the sandbox does not run
// (so its files are served from the host).
func (f *FS) stopped(ctx context.Context, c *Client, err error) bool {
	if ctx.Err() != nil || !errdefs.IsUnavailable(err) || c.Alive == nil {
		return false
	}
	return c.Alive(ctx) != nil
}

// do runs op through the agent, or on the host when the agent cannot.
func (f *FS) do(ctx context.Context, viaAgent func(*Client) error, onHost func() error) error {
	c, err := f.client(ctx)
	if err != nil {
		return err
	}
	if c == nil {
		return onHost()
	}
	err = viaAgent(c)
	if err != nil && f.stopped(ctx, c, err) {
		return onHost()
	}
	return err
}

func (f *FS) ReadFile(ctx context.Context, p string, w io.Writer) error {
	// A read that wrote something before the agent went away cannot start
	// over on the host: count what reached w.
	cw := &countingWriter{w: w}
	c, err := f.client(ctx)
	if err != nil {
		return err
	}
	if c == nil {
		return f.Host.ReadFile(ctx, p, w)
	}
	err = c.ReadFile(ctx, p, f.MaxRead, cw)
	if err != nil && cw.n == 0 && f.stopped(ctx, c, err) {
		return f.Host.ReadFile(ctx, p, w)
	}
	return err
}

type countingWriter struct {
	w io.Writer
	n int64
}

func (c *countingWriter) Write(b []byte) (int, error) {
	n, err := c.w.Write(b)
	c.n += int64(n)
	return n, err
}

func (f *FS) WriteFile(ctx context.Context, p string, r io.Reader, mode os.FileMode) error {
	c, err := f.client(ctx)
	if err != nil {
		return err
	}
	if c == nil {
		return f.Host.WriteFile(ctx, p, r, mode)
	}
	n, err := c.writeFile(ctx, p, r, mode)
	if err != nil && n == 0 && f.stopped(ctx, c, err) {
		return f.Host.WriteFile(ctx, p, r, mode)
	}
	return err
}

func (f *FS) Stat(ctx context.Context, p string) (sandbox.FileInfo, error) {
	var out sandbox.FileInfo
	err := f.do(ctx, func(c *Client) error {
		fi, err := c.Stat(ctx, p)
		out = toFileInfo(fi)
		return err
	}, func() (err error) {
		out, err = f.Host.Stat(ctx, p)
		return err
	})
	return out, err
}

func (f *FS) List(ctx context.Context, dir string) ([]sandbox.FileInfo, error) {
	var out []sandbox.FileInfo
	err := f.do(ctx, func(c *Client) error {
		fis, err := c.List(ctx, dir)
		if err != nil {
			return err
		}
		out = make([]sandbox.FileInfo, 0, len(fis))
		for _, fi := range fis {
			out = append(out, toFileInfo(fi))
		}
		return nil
	}, func() (err error) {
		out, err = f.Host.List(ctx, dir)
		return err
	})
	return out, err
}

func (f *FS) Mkdir(ctx context.Context, p string, mode os.FileMode) error {
	return f.do(ctx, func(c *Client) error { return c.Mkdir(ctx, p, mode) },
		func() error { return f.Host.Mkdir(ctx, p, mode) })
}

func (f *FS) Rename(ctx context.Context, from, to string) error {
	return f.do(ctx, func(c *Client) error { return c.Rename(ctx, from, to) },
		func() error { return f.Host.Rename(ctx, from, to) })
}

func (f *FS) Remove(ctx context.Context, p string, recursive bool) error {
	return f.do(ctx, func(c *Client) error { return c.Remove(ctx, p, recursive) },
		func() error { return f.Host.Remove(ctx, p, recursive) })
}

// TarOut and TarIn are the host's (the layer's view).
func (f *FS) TarOut(ctx context.Context, p string, w io.Writer) error {
	return f.Host.TarOut(ctx, p, w)
}

func (f *FS) TarIn(ctx context.Context, dir string, r io.Reader) error {
	return f.Host.TarIn(ctx, dir, r)
}

func toFileInfo(fi agentproto.FileInfo) sandbox.FileInfo {
	return sandbox.FileInfo{Name: fi.Name, Size: fi.Size, Mode: os.FileMode(fi.Mode), ModTime: time.Unix(0, fi.MTime), Link: fi.Link}
}
