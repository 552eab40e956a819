package client

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/url"
	"strconv"

	"github.com/amber-run/amber/api"
)

// Exec runs r.Args (or r.Cmd, a shell command line) in sandbox id to completion, writing its output to stdout
// and stderr (nil discards) as it comes. When stdin is non-nil it is streamed
// to the command while output is read (r.Stdin is then ignored); otherwise
// r.Stdin, if any, is the whole input. The command's exit status is
// returned; a non-zero exit code is not an error.
func (c *Client) Exec(ctx context.Context, id string, r api.ExecRequest, stdin io.Reader, stdout, stderr io.Writer) (api.ExitStatus, error) {
	var body io.Reader
	var q url.Values
	ctype := "application/json"
	if stdin != nil {
		q = url.Values{"arg": r.Args, "env": r.Env}
		if r.Cmd != "" {
			q.Set("cmd", r.Cmd)
		}
		if r.Cwd != "" {
			q.Set("cwd", r.Cwd)
		}
		if r.TTY {
			q.Set("tty", "true")
		}
		if r.TimeoutMS > 0 {
			q.Set("timeout_ms", strconv.FormatInt(r.TimeoutMS, 10))
		}
		body, ctype = stdin, "application/octet-stream"
	} else {
		b, err := json.Marshal(r)
		if err != nil {
			return api.ExitStatus{}, err
		}
		body = bytesReader(b)
	}
	req, err := c.request(ctx, "POST", sbPath(id, "/exec"), q, body, ctype)
	if err != nil {
		return api.ExitStatus{}, err
	}
	resp, err := c.send(req)
	if err != nil {
		return api.ExitStatus{}, err
	}
	defer resp.Body.Close()
	dec := json.NewDecoder(resp.Body)
	for {
		var f api.ExecFrame
		if err := dec.Decode(&f); err != nil {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return api.ExitStatus{}, fmt.Errorf("exec in %s: output stream broke before the exit status: %w", id, err)
		}
		switch {
		case f.Exit != nil:
			return *f.Exit, nil
		case f.Error != nil:
			return api.ExitStatus{}, fromFrame(*f.Error)
		case f.Stream == "stdout" && stdout != nil:
			if _, err := stdout.Write(f.Data); err != nil {
				return api.ExitStatus{}, err
			}
		case f.Stream == "stderr" && stderr != nil:
			if _, err := stderr.Write(f.Data); err != nil {
				return api.ExitStatus{}, err
			}
		}
	}
}
