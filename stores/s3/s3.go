// Package s3 is a blob.Store on S3-compatible object storage, through
// minio-go. It is tested against a real MinIO server (see miniotest).
//
// # Mapping
//
// A key k is the object Config.Prefix+k in Config.Bucket. Put is one PUT
// (or a multipart upload for objects over PartSize), which S3 makes visible
// atomically and only once the server has acknowledged it durable (for
// MinIO, after its write quorum); a failed upload leaves nothing. PutIfAbsent
// is a PUT with "If-None-Match: *", which S3 and MinIO answer with 412
// Precondition Failed when the object exists: the server decides, so exactly
// one of concurrent callers wins. Get is one GET, streaming one version.
// List pages through ListObjectsV2 (sorted by key).
package s3

import (
	"context"
	"errors"
	"fmt"
	"io"
	"iter"
	"net"
	"net/http"
	"strings"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"

	"github.com/amber-run/amber/core/blob"
	"github.com/amber-run/amber/core/errdefs"
)

// PartSize is the multipart part size: objects larger than it (or of unknown
// size) are uploaded in parts of this size, each buffered in memory.
const PartSize = 16 << 20

// Config says where the store lives.
type Config struct {
	// Endpoint is host:port of the S3 service.
	Endpoint  string
	AccessKey string
	SecretKey string
	// Secure selects https.
	Secure bool
	// Region; empty lets the client discover it.
	Region string
	// Bucket holds the objects.
	Bucket string
	// Prefix, when set, is prepended to every key, so several stores can
	// share a bucket. It must end in "/".
	Prefix string
	// CreateBucket makes Open create Bucket when it does not exist.
	CreateBucket bool
	// ListPageSize is the number of keys List asks for per request (0: the
	// server's default, 1000). Tests set it small to exercise paging.
	ListPageSize int
	// Transport, when set, replaces the default HTTP transport.
	Transport http.RoundTripper
}

// Store is a blob.Store on one bucket (and prefix).
type Store struct {
	cfg  Config
	core *minio.Core
}

var _ blob.Store = (*Store)(nil)

// Open connects to the service and checks the bucket (creating it when
// cfg.CreateBucket is set). A missing bucket is errdefs.ErrNotFound.
func Open(ctx context.Context, cfg Config) (*Store, error) {
	if cfg.Endpoint == "" || cfg.Bucket == "" {
		return nil, errdefs.InvalidArgumentf("s3: endpoint and bucket are required")
	}
	if cfg.Prefix != "" {
		if !strings.HasSuffix(cfg.Prefix, "/") {
			return nil, errdefs.InvalidArgumentf("s3: prefix %q must end in /", cfg.Prefix)
		}
		if err := blob.ValidatePrefix(cfg.Prefix); err != nil {
			return nil, err
		}
	}
	client, err := minio.New(cfg.Endpoint, &minio.Options{
		Creds:     credentials.NewStaticV4(cfg.AccessKey, cfg.SecretKey, ""),
		Secure:    cfg.Secure,
		Region:    cfg.Region,
		Transport: cfg.Transport,
	})
	if err != nil {
		return nil, errdefs.InvalidArgumentf("s3 %s: %v", cfg.Endpoint, err)
	}
	s := &Store{cfg: cfg, core: &minio.Core{Client: client}}
	ok, err := client.BucketExists(ctx, cfg.Bucket)
	if err != nil {
		return nil, s.mapErr("open bucket", cfg.Bucket, err)
	}
	if !ok {
		if !cfg.CreateBucket {
			return nil, errdefs.NotFoundf("s3 %s: bucket %s", cfg.Endpoint, cfg.Bucket)
		}
		err := client.MakeBucket(ctx, cfg.Bucket, minio.MakeBucketOptions{Region: cfg.Region})
		if err != nil && minio.ToErrorResponse(err).Code != "BucketAlreadyOwnedByYou" {
			return nil, s.mapErr("create bucket", cfg.Bucket, err)
		}
	}
	return s, nil
}

func (s *Store) object(key string) string { return s.cfg.Prefix + key }

// Put implements blob.Store.
func (s *Store) Put(ctx context.Context, key string, r io.Reader, size int64) error {
	return s.put(ctx, key, r, size, false)
}

// PutIfAbsent implements blob.Store.
func (s *Store) PutIfAbsent(ctx context.Context, key string, r io.Reader, size int64) error {
	return s.put(ctx, key, r, size, true)
}

func (s *Store) put(ctx context.Context, key string, r io.Reader, size int64, exclusive bool) error {
	if err := blob.ValidateKey(key); err != nil {
		return err
	}
	opts := minio.PutObjectOptions{PartSize: PartSize, ContentType: "application/octet-stream"}
	if exclusive {
		opts.SetMatchETagExcept("*") // If-None-Match: *
	}
	src := &exactReader{r: r, left: size}
	_, err := s.core.Client.PutObject(ctx, s.cfg.Bucket, s.object(key), src, size, opts)
	switch {
	case src.short:
		return errdefs.InvalidArgumentf("put %s: reader gave %d bytes, want %d", key, size-src.left, size)
	case src.long:
		return errdefs.InvalidArgumentf("put %s: reader gave more than %d bytes", key, size)
	case err == nil:
		return nil
	case exclusive && isPreconditionFailed(err):
		return errdefs.AlreadyExistsf("put %s", key)
	case ctx.Err() != nil:
		return fmt.Errorf("put %s: %w", key, ctx.Err())
	case src.err != nil:
		return fmt.Errorf("put %s: %w", key, src.err)
	}
	return s.mapErr("put", key, err)
}

func isPreconditionFailed(err error) bool {
	resp := minio.ToErrorResponse(err)
	return resp.StatusCode == http.StatusPreconditionFailed || resp.Code == "PreconditionFailed"
}

// exactReader passes through exactly left bytes of r (all of r when left < 0)
// and notes a reader that is shorter or longer than announced.
type exactReader struct {
	r           io.Reader
	left        int64
	short, long bool
	err         error
}

func (e *exactReader) Read(p []byte) (int, error) {
	if e.left < 0 {
		n, err := e.r.Read(p)
		if err != nil && err != io.EOF {
			e.err = err
		}
		return n, err
	}
	if e.left == 0 {
		return 0, io.EOF
	}
	if int64(len(p)) > e.left {
		p = p[:e.left]
	}
	n, err := e.r.Read(p)
	e.left -= int64(n)
	switch {
	case err == io.EOF && e.left > 0:
		e.short = true
		return n, io.ErrUnexpectedEOF
	case err == io.EOF:
		return n, io.EOF
	case err != nil:
		e.err = err
		return n, err
	case e.left == 0:
		// The last announced byte: the client may never read again, so
		// probe now for trailing bytes and fail the upload if there are.
		var one [1]byte
		if m, _ := io.ReadFull(e.r, one[:]); m > 0 {
			e.long = true
			return 0, errors.New("reader longer than announced")
		}
		return n, io.EOF
	}
	return n, nil
}

// Get implements blob.Store.
func (s *Store) Get(ctx context.Context, key string) (io.ReadCloser, error) {
	if err := blob.ValidateKey(key); err != nil {
		return nil, err
	}
	rc, _, _, err := s.core.GetObject(ctx, s.cfg.Bucket, s.object(key), minio.GetObjectOptions{})
	if err != nil {
		return nil, s.mapErr("get", key, err)
	}
	return rc, nil
}

// GetRange implements blob.RangeGetter with an HTTP range request.
func (s *Store) GetRange(ctx context.Context, key string, off, n int64) (io.ReadCloser, error) {
	if err := blob.ValidateKey(key); err != nil {
		return nil, err
	}
	if n <= 0 {
		return io.NopCloser(strings.NewReader("")), nil
	}
	opts := minio.GetObjectOptions{}
	if err := opts.SetRange(off, off+n-1); err != nil {
		return nil, errdefs.InvalidArgumentf("get %s: %v", key, err)
	}
	rc, _, _, err := s.core.GetObject(ctx, s.cfg.Bucket, s.object(key), opts)
	if err != nil {
		return nil, s.mapErr("get", key, err)
	}
	return rc, nil
}

// Stat implements blob.Store.
func (s *Store) Stat(ctx context.Context, key string) (blob.Info, error) {
	if err := blob.ValidateKey(key); err != nil {
		return blob.Info{}, err
	}
	oi, err := s.core.Client.StatObject(ctx, s.cfg.Bucket, s.object(key), minio.StatObjectOptions{})
	if err != nil {
		return blob.Info{}, s.mapErr("stat", key, err)
	}
	return blob.Info{Key: key, Size: oi.Size, ModTime: oi.LastModified}, nil
}

// Delete implements blob.Store.
func (s *Store) Delete(ctx context.Context, key string) error {
	if err := blob.ValidateKey(key); err != nil {
		return err
	}
	err := s.core.Client.RemoveObject(ctx, s.cfg.Bucket, s.object(key), minio.RemoveObjectOptions{})
	if err != nil && !errdefs.IsNotFound(s.mapErr("delete", key, err)) {
		return s.mapErr("delete", key, err)
	}
	return nil
}

// List implements blob.Store.
func (s *Store) List(ctx context.Context, prefix string) iter.Seq2[blob.Info, error] {
	return func(yield func(blob.Info, error) bool) {
		if err := blob.ValidatePrefix(prefix); err != nil {
			yield(blob.Info{}, err)
			return
		}
		ctx, cancel := context.WithCancel(ctx)
		defer cancel() // stops minio-go's listing goroutine on an early break
		for oi := range s.core.Client.ListObjects(ctx, s.cfg.Bucket, minio.ListObjectsOptions{
			Prefix:    s.object(prefix),
			Recursive: true,
			MaxKeys:   s.cfg.ListPageSize,
		}) {
			if oi.Err != nil {
				yield(blob.Info{}, s.mapErr("list", prefix, oi.Err))
				return
			}
			key := strings.TrimPrefix(oi.Key, s.cfg.Prefix)
			if blob.ValidateKey(key) != nil {
				continue // not written through a Store (e.g. a "dir/" marker)
			}
			if !yield(blob.Info{Key: key, Size: oi.Size, ModTime: oi.LastModified}, nil) {
				return
			}
		}
	}
}

// mapErr turns S3 and transport errors into error kinds.
func (s *Store) mapErr(op, key string, err error) error {
	resp := minio.ToErrorResponse(err)
	switch resp.Code {
	case "NoSuchKey", "NoSuchObject":
		return errdefs.NotFoundf("%s %s", op, key)
	case "NoSuchBucket":
		return errdefs.NotFoundf("%s %s: bucket %s: %v", op, key, s.cfg.Bucket, err)
	case "XMinioParentIsObject", "XMinioObjectExistsAsDirectory", "ObjectExistsAsDirectory":
		return errdefs.Conflictf("%s %s: key is a path prefix of another key (or the reverse): %v", op, key, err)
	case "AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch":
		return errdefs.PermissionDeniedf("%s %s: %v", op, key, err)
	case "SlowDown", "ServerBusy", "ServiceUnavailable", "RequestTimeout", "InternalError", "XMinioServerNotInitialized":
		return errdefs.Unavailablef("%s %s: %v", op, key, err)
	case "XMinioStorageFull", "EntityTooLarge":
		return errdefs.ResourceExhaustedf("%s %s: %v", op, key, err)
	}
	if resp.StatusCode == http.StatusNotFound {
		return errdefs.NotFoundf("%s %s", op, key)
	}
	var ne net.Error
	if errors.As(err, &ne) || errors.Is(err, io.ErrUnexpectedEOF) || resp.StatusCode >= 500 {
		return errdefs.Unavailablef("%s %s: %v", op, key, err)
	}
	return fmt.Errorf("s3 %s %s: %w", op, key, err)
}
