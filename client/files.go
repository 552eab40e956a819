package client

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/url"
	"os"

	"github.com/amber-run/amber/api"
)

// ReadFile copies the content of file path in sandbox id to w.
func (c *Client) ReadFile(ctx context.Context, id, path string, w io.Writer) error {
	return c.streamID(ctx, id, "/files", url.Values{"path": {path}}, w)
}

func (c *Client) streamID(ctx context.Context, id, sub string, q url.Values, w io.Writer) error {
	req, err := c.request(ctx, "GET", sbPath(id, sub), q, nil, "")
	if err != nil {
		return err
	}
	resp, err := c.send(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); ct == "application/json" && sub == "/files" {
		return fmt.Errorf("%s is a directory: %w", q.Get("path"), errIsDir)
	}
	_, err = io.Copy(w, resp.Body)
	return err
}

var errIsDir = &Error{Status: 400, Kind: "invalid argument", Message: "is a directory"}

// Stat describes path in sandbox id.
func (c *Client) Stat(ctx context.Context, id, path string) (api.FileInfo, error) {
	var out api.FileInfo
	return out, c.do(ctx, "GET", sbPath(id, "/files"), url.Values{"path": {path}, "stat": {"true"}}, nil, &out)
}

// List lists directory dir in sandbox id.
func (c *Client) List(ctx context.Context, id, dir string) ([]api.FileInfo, error) {
	fi, err := c.Stat(ctx, id, dir)
	if err != nil {
		return nil, err
	}
	if fi.Type != "dir" {
		return []api.FileInfo{fi}, nil
	}
	req, err := c.request(ctx, "GET", sbPath(id, "/files"), url.Values{"path": {dir}}, nil, "")
	if err != nil {
		return nil, err
	}
	resp, err := c.send(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var out api.FileList
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		return nil, fmt.Errorf("list %s: %w", dir, err)
	}
	return out.Entries, nil
}

// WriteFile writes r to path in sandbox id with permissions mode.
func (c *Client) WriteFile(ctx context.Context, id, path string, r io.Reader, mode os.FileMode) error {
	return c.upload(ctx, "PUT", sbPath(id, "/files"), url.Values{"path": {path}, "mode": {fmt.Sprintf("%04o", mode.Perm())}}, r, "application/octet-stream")
}

func (c *Client) upload(ctx context.Context, method, p string, q url.Values, r io.Reader, ctype string) error {
	req, err := c.request(ctx, method, p, q, r, ctype)
	if err != nil {
		return err
	}
	resp, err := c.send(req)
	if err != nil {
		return err
	}
	resp.Body.Close()
	return nil
}

// Remove removes path (recursively for a directory when recursive).
func (c *Client) Remove(ctx context.Context, id, path string, recursive bool) error {
	return c.do(ctx, "DELETE", sbPath(id, "/files"), url.Values{"path": {path}, "recursive": {fmt.Sprint(recursive)}}, nil, nil)
}

// Mkdir creates directory path with permissions mode.
func (c *Client) Mkdir(ctx context.Context, id, path string, mode os.FileMode) error {
	return c.do(ctx, "POST", sbPath(id, "/files/mkdir"), url.Values{"path": {path}, "mode": {fmt.Sprintf("%04o", mode.Perm())}}, nil, nil)
}

// Rename renames from to to inside sandbox id, as rename(2): both absolute
// sandbox paths; an existing file at to is replaced.
func (c *Client) Rename(ctx context.Context, id, from, to string) error {
	return c.do(ctx, "POST", sbPath(id, "/files/rename"), nil, api.RenameRequest{From: from, To: to}, nil)
}

// TarOut writes a tar of path in sandbox id to w.
func (c *Client) TarOut(ctx context.Context, id, path string, w io.Writer) error {
	return c.streamID(ctx, id, "/files/tar", url.Values{"path": {path}}, w)
}

// TarIn extracts the tar r under directory dir in sandbox id.
func (c *Client) TarIn(ctx context.Context, id, dir string, r io.Reader) error {
	return c.upload(ctx, "PUT", sbPath(id, "/files/tar"), url.Values{"path": {dir}}, r, "application/x-tar")
}
