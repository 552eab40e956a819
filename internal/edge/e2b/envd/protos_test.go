package envd_test

import (
	"encoding/base64"
	"os"
	"path/filepath"
	"regexp"
	"testing"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/descriptorpb"

	fspb "github.com/amber-run/amber/internal/edge/e2b/envdpb/filesystem"
	pb "github.com/amber-run/amber/internal/edge/e2b/envdpb/process"
)

// normalized is a file descriptor without what differs between protoc's
// and the SDK's embedded copy but not on the wire: json names, file
// options (go_package, java_*…), dependencies, source info.
func normalized(fd *descriptorpb.FileDescriptorProto) *descriptorpb.FileDescriptorProto {
	fd = proto.Clone(fd).(*descriptorpb.FileDescriptorProto)
	fd.Options, fd.Dependency, fd.SourceCodeInfo = nil, nil, nil
	var msgs func([]*descriptorpb.DescriptorProto)
	msgs = func(ms []*descriptorpb.DescriptorProto) {
		for _, m := range ms {
			for _, f := range m.Field {
				f.JsonName = nil
			}
			msgs(m.NestedType)
		}
	}
	msgs(fd.MessageType)
	return fd
}

// TestProtosMatchTheSDK: the protos envd is generated from describe, message
// for message and field for field, what the pinned e2b package embeds (its
// dist/index.js holds each file's descriptor): a drift between this envd
// and the SDK fails here, not in a user's program.
func TestProtosMatchTheSDK(t *testing.T) {
	js, err := os.ReadFile(filepath.Join(sdkDir(t), "node_modules", "e2b", "dist", "index.js"))
	if err != nil {
		t.Fatal(err)
	}
	embedded := map[string]*descriptorpb.FileDescriptorProto{}
	for _, m := range regexp.MustCompile(`fileDesc\)\(\s*"([A-Za-z0-9+/=]+)"`).FindAllSubmatch(js, -1) {
		b, err := base64.RawStdEncoding.DecodeString(string(regexp.MustCompile(`=+$`).ReplaceAll(m[1], nil)))
		if err != nil {
			t.Fatal(err)
		}
		fd := &descriptorpb.FileDescriptorProto{}
		if err := proto.Unmarshal(b, fd); err != nil {
			t.Fatal(err)
		}
		embedded[fd.GetName()] = fd
	}
	for _, f := range []protoreflect.FileDescriptor{pb.File_process_process_proto, fspb.File_filesystem_filesystem_proto} {
		sdk, ok := embedded[f.Path()]
		if !ok {
			t.Errorf("the SDK embeds no %s (it has %d files)", f.Path(), len(embedded))
			continue
		}
		ours := normalized(protodesc.ToFileDescriptorProto(f))
		if theirs := normalized(sdk); !proto.Equal(ours, theirs) {
			t.Errorf("%s differs from the SDK's:\nours   %v\ntheirs %v", f.Path(), ours, theirs)
		}
	}
}
