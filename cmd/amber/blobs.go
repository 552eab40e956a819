package main

import (
	"context"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"strings"

	"github.com/amber-run/amber/core/blob"
	"github.com/amber-run/amber/stores/localfs"
	"github.com/amber-run/amber/stores/s3"
)

// openBlobs opens the checkpoint blob store named by spec:
//
//	""                         DATA_DIR/blobs on the local disk
//	/path or ./path            a local directory
//	s3://HOST:PORT/BUCKET[/PREFIX][?secure=false&region=R&create=true]
//	                           S3 or MinIO; the keys come from AMBER_S3_ACCESS_KEY
//	                           and AMBER_S3_SECRET_KEY (never from the command line,
//	                           which other users of the machine can read)
func openBlobs(ctx context.Context, dataDir, spec string, lg *slog.Logger) (blob.Store, string, error) {
	if !strings.HasPrefix(spec, "s3://") {
		dir := spec
		if dir == "" {
			dir = filepath.Join(dataDir, "blobs")
		}
		bs, err := localfs.Open(dir)
		if err != nil {
			return nil, "", fmt.Errorf("blob store %s: %w", dir, err)
		}
		return bs, dir, nil
	}
	cfg, err := parseS3(spec)
	if err != nil {
		return nil, "", usageError{err}
	}
	cfg.AccessKey, cfg.SecretKey = os.Getenv("AMBER_S3_ACCESS_KEY"), os.Getenv("AMBER_S3_SECRET_KEY")
	if cfg.AccessKey == "" || cfg.SecretKey == "" {
		return nil, "", usageError{fmt.Errorf("--blobs %s: set AMBER_S3_ACCESS_KEY and AMBER_S3_SECRET_KEY", redactS3(spec))}
	}
	bs, err := s3.Open(ctx, cfg)
	if err != nil {
		return nil, "", fmt.Errorf("blob store %s: %w", redactS3(spec), err)
	}
	lg.Info("checkpoint blobs on S3", "endpoint", cfg.Endpoint, "bucket", cfg.Bucket, "prefix", cfg.Prefix)
	return bs, redactS3(spec), nil
}

// parseS3 reads an s3:// blob store address (without credentials).
func parseS3(spec string) (s3.Config, error) {
	u, err := url.Parse(spec)
	if err != nil {
		return s3.Config{}, fmt.Errorf("--blobs %q: %v", spec, err)
	}
	if u.User != nil {
		return s3.Config{}, fmt.Errorf("--blobs: put the S3 keys in AMBER_S3_ACCESS_KEY and AMBER_S3_SECRET_KEY, not in the address")
	}
	bucket, prefix, _ := strings.Cut(strings.Trim(u.Path, "/"), "/")
	if u.Host == "" || bucket == "" {
		return s3.Config{}, fmt.Errorf("--blobs %q: want s3://HOST:PORT/BUCKET[/PREFIX]", spec)
	}
	cfg := s3.Config{Endpoint: u.Host, Bucket: bucket, Secure: true, Region: u.Query().Get("region")}
	if prefix != "" {
		cfg.Prefix = strings.TrimSuffix(prefix, "/") + "/"
	}
	for k, v := range u.Query() {
		switch k {
		case "secure":
			cfg.Secure = v[0] != "false"
		case "create":
			cfg.CreateBucket = v[0] == "true"
		case "region":
		default:
			return s3.Config{}, fmt.Errorf("--blobs %q: unknown parameter %q (have secure, region, create)", spec, k)
		}
	}
	return cfg, nil
}

func redactS3(spec string) string {
	if u, err := url.Parse(spec); err == nil {
		u.User = nil
		return u.String()
	}
	return "s3://…"
}
