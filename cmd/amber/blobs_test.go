package main

import (
	"testing"
)

func TestParseS3(t *testing.T) {
	for _, c := range []struct {
		in, endpoint, bucket, prefix string
		secure, create               bool
		bad                          bool
	}{
		{in: "s3://127.0.0.1:9000/ckpts?secure=false&create=true", endpoint: "127.0.0.1:9000", bucket: "ckpts", create: true},
		{in: "s3://s3.example.com/b/node-1/", endpoint: "s3.example.com", bucket: "b", prefix: "node-1/", secure: true},
		{in: "s3://h:1/b/a/b", endpoint: "h:1", bucket: "b", prefix: "a/b/", secure: true},
		{in: "s3://key:secret@h:1/b", bad: true},
		{in: "s3://h:1/", bad: true},
		{in: "s3:///b", bad: true},
		{in: "s3://h:1/b?colour=red", bad: true},
	} {
		cfg, err := parseS3(c.in)
		if c.bad {
			if err == nil {
				t.Errorf("%s: accepted as %+v", c.in, cfg)
			}
			continue
		}
		if err != nil || cfg.Endpoint != c.endpoint || cfg.Bucket != c.bucket || cfg.Prefix != c.prefix ||
			cfg.Secure != c.secure || cfg.CreateBucket != c.create {
			t.Errorf("%s: %+v %v", c.in, cfg, err)
		}
	}
}
