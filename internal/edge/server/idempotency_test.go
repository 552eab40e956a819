package server_test

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/amber-run/amber/api"
)

// TestIdempotencyKey: a retried create with the same Idempotency-Key gets
// the first answer and creates nothing; the key with another request is
// refused; without a key every call creates.
func TestIdempotencyKey(t *testing.T) {
	c, env, base := newAPI(t)
	ctx := ctxT(t)
	post := func(path, key, body string) (int, http.Header, []byte) {
		t.Helper()
		req, _ := http.NewRequest("POST", base+path, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+testKey)
		req.Header.Set("Content-Type", "application/json")
		if key != "" {
			req.Header.Set("Idempotency-Key", key)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, resp.Header, b
	}
	const create = `{"template":"minimal","cold":true}`
	code1, _, b1 := post("/v1/sandboxes", "create-1", create)
	code2, h2, b2 := post("/v1/sandboxes", "create-1", create)
	if code1 != 201 || code2 != 201 || !bytes.Equal(b1, b2) || h2.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("retry: %d %s / %d %s %v", code1, b1, code2, b2, h2)
	}
	var sb api.Sandbox
	if err := json.Unmarshal(b1, &sb); err != nil {
		t.Fatal(err)
	}
	if l, _ := env.Engine.List(ctx, "default"); len(l) != 1 {
		t.Fatalf("%d sandboxes after a retried create, want 1", len(l))
	}
	if code, _, b := post("/v1/sandboxes", "create-1", `{"template":"minimal","cold":true,"env":["X=1"]}`); code != 400 || !strings.Contains(string(b), "another request") {
		t.Errorf("key reused for another request: %d %s", code, b)
	}
	// A failed call forgets its key: the retry runs.
	if code, _, _ := post("/v1/sandboxes", "create-2", `{"template":"nosuch"}`); code/100 == 2 {
		t.Fatalf("create from a missing template succeeded")
	}
	if code, h, _ := post("/v1/sandboxes", "create-2", create); code != 201 || h.Get("Idempotent-Replayed") != "" {
		t.Errorf("retry after a failure: %d %v", code, h)
	}
	// Checkpoints too: one checkpoint for two calls.
	p := "/v1/sandboxes/" + sb.ID + "/checkpoints"
	code1, _, b1 = post(p, "ckpt-1", "")
	code2, _, b2 = post(p, "ckpt-1", "")
	if code1 != 201 || code2 != 201 || !bytes.Equal(b1, b2) {
		t.Fatalf("checkpoint retry: %d %s / %d %s", code1, b1, code2, b2)
	}
	if cks, err := c.ListCheckpoints(ctx, sb.ID, true); err != nil || len(cks) != 1 {
		t.Fatalf("%d checkpoints after a retried checkpoint (%v), want 1", len(cks), err)
	}
	// Without a key, every call creates.
	post("/v1/sandboxes", "", create)
	post("/v1/sandboxes", "", create)
	if l, _ := env.Engine.List(ctx, "default"); len(l) != 4 {
		t.Errorf("%d sandboxes, want 4", len(l))
	}
	if code, _, _ := post("/v1/sandboxes", strings.Repeat("k", 201), create); code != 400 {
		t.Errorf("an over-long key: %d", code)
	}
}
