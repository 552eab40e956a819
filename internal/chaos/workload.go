package chaos

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strings"

	"github.com/amber-run/amber/api"
	"github.com/amber-run/amber/client"
)

// The chaos reference workload: one scripted agent session (strict policy)
// that touches every kind of state of the brief that a python sandbox has —
// a long-running server holding a counter in memory, with a child process
// (a process tree) and an environment variable only it has; files in /root;
// a tmpfs file (/dev/shm); a SQLite database in the sandbox; outbound HTTP
// effects to the harness's ledger (through the egress gateway); and
// a client following the session's events over SSE (run.go). Every tool
// output is deterministic (the counter counts calls, not time), so a run
// can be compared with the golden run byte for byte.

const chaosApp = `import os, socket, subprocess
child = subprocess.Popen(["python3", "-c", "import time\nwhile True: time.sleep(3600)", "chaos-child"])
n = 0
srv = socket.socket()
srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind(("127.0.0.1", 9009))
srv.listen(8)
while True:
    c, _ = srv.accept()
    cmd = c.recv(64).decode().strip()
    if cmd == "inc":
        n += 1
        out = str(n)
    elif cmd == "get":
        out = str(n)
    elif cmd == "env":
        out = os.environ.get("CHAOS_MARK", "")
    elif cmd == "child":
        out = "alive" if child.poll() is None else "dead"
    else:
        out = "?"
    c.sendall((out + "\n").encode())
    c.close()
`

const chaosClient = `import socket, sys, time
for i in range(300):
    try:
        c = socket.create_connection(("127.0.0.1", 9009), timeout=10)
        break
    except OSError:
        time.sleep(0.1)
c.sendall(sys.argv[1].encode())
print(c.recv(64).decode().strip())
`

const chaosDB = `import sqlite3, sys
db = sqlite3.connect("/root/shop.db")
db.execute("create table if not exists orders(item text)")
if len(sys.argv) > 1:
    db.execute("insert into orders values (?)", (sys.argv[1],))
db.commit()
print("db:" + ",".join(r[0] for r in db.execute("select item from orders order by rowid")))
`

const chaosNotes = "# Errands\n\nA book, a lamp, tea; count each step.\n"

// chaosStateCmd prints the sandbox's state: the server's memory, its
// environment and child, the database, the tmpfs file and the files' hashes.
const chaosStateCmd = "python3 /root/client.py get; python3 /root/client.py env; python3 /root/client.py child; " +
	"python3 /root/db.py; cat /dev/shm/scratch.txt; cd /root && sha256sum notes.md app.py client.py db.py"

// chaosItems are the orders the agent places (gvisor: through the gateway).
var chaosItems = []string{"book", "lamp", "tea"}

// chaosScript is the agent: turn n answers the session's n-th model call.
func chaosScript(shopURL string) []map[string]any {
	call := func(name string, input map[string]any) map[string]any {
		return map[string]any{"name": name, "input": input}
	}
	bash := func(cmd string) map[string]any {
		return map[string]any{"tool_calls": []any{call("bash", map[string]any{"command": cmd})}}
	}
	step := func(i int, item string) string {
		return fmt.Sprintf("python3 /root/client.py inc && python3 /root/db.py %s && echo scratch-%d >> /dev/shm/scratch.txt && cat /dev/shm/scratch.txt", item, i)
	}
	turns := []map[string]any{
		{"tool_calls": []any{
			call("write_file", map[string]any{"path": "/root/notes.md", "content": chaosNotes}),
			call("write_file", map[string]any{"path": "/root/app.py", "content": chaosApp}),
			call("write_file", map[string]any{"path": "/root/client.py", "content": chaosClient}),
			call("write_file", map[string]any{"path": "/root/db.py", "content": chaosDB}),
		}},
		bash("cd /root && (CHAOS_MARK=amber-chaos nohup python3 app.py >/dev/null 2>&1 &) && python3 client.py get && python3 db.py && echo scratch-0 > /dev/shm/scratch.txt"),
	}
	for i, item := range chaosItems {
		body, _ := json.Marshal(map[string]any{"item": item, "qty": 1})
		turns = append(turns, map[string]any{"tool_calls": []any{call("http", map[string]any{"method": "POST", "url": shopURL + "/orders",
			"headers": map[string]string{"Content-Type": "application/json"}, "body": string(body)})}})
		turns = append(turns, bash(step(i+1, item)))
	}
	turns = append(turns, bash(chaosStateCmd), map[string]any{"text": "Done: every errand once."})
	return turns
}

// chaosOutcome is what a run is compared on with the golden run.
type chaosOutcome struct {
	// Conversation: the model's answers and the tools' results, in log
	// order, without timings, attempts or checkpoint ids.
	Conversation []string `json:"conversation"`
	// State: chaosStateCmd run by the harness in the final sandbox.
	State []string `json:"state"`
	// Processes: the sandbox's processes of the workload (command lines).
	Processes []string `json:"processes"`
	// Ledger: the shop's booked orders, in order.
	Ledger []string `json:"ledger"`
}

// conversation folds a session's events into chaosOutcome.Conversation.
// The shop's address (its port differs between runs) reads SHOP.
func chaosConversation(evs []api.Event, shopURL string) []string {
	var out []string
	for _, ev := range evs {
		switch ev.Type {
		case "session.assistant_message":
			var m struct {
				Call      int    `json:"call"`
				Text      string `json:"text"`
				ToolCalls []struct {
					Name  string          `json:"name"`
					Input json.RawMessage `json:"input"`
				} `json:"tool_calls"`
			}
			json.Unmarshal(ev.Payload, &m)
			var calls []string
			for _, c := range m.ToolCalls {
				sum := sha256.Sum256([]byte(strings.ReplaceAll(string(c.Input), shopURL, "SHOP")))
				calls = append(calls, c.Name+"#"+hex.EncodeToString(sum[:4]))
			}
			out = append(out, fmt.Sprintf("assistant %d: %q %s", m.Call, m.Text, strings.Join(calls, " ")))
		case "session.tool_result":
			var r struct {
				Name    string `json:"name"`
				Output  string `json:"output"`
				IsError bool   `json:"is_error"`
			}
			json.Unmarshal(ev.Payload, &r)
			out = append(out, fmt.Sprintf("tool %s error=%v: %q", r.Name, r.IsError, r.Output))
		case "session.user_message":
			var m struct {
				Text string `json:"text"`
			}
			json.Unmarshal(ev.Payload, &m)
			out = append(out, fmt.Sprintf("user: %q", m.Text))
		}
	}
	return out
}

// collectOutcome reads a finished run's outcome through the API.
func collectOutcome(ctx context.Context, cl *client.Client, sbx string, evs []api.Event, ledger []string, shopURL string) chaosOutcome {
	o := chaosOutcome{Conversation: chaosConversation(evs, shopURL), Ledger: append([]string{}, ledger...)}
	// The reads are retried as the client's calls are (retryServerErrors):
	// the daemon may be restarted under them (an upload's fault after the
	// session's last step), and the state command only reads.
	var out strings.Builder
	var st api.ExitStatus
	err := retryServerErrors(ctx, func() (err error) {
		out.Reset()
		st, err = cl.Exec(ctx, sbx, api.ExecRequest{Args: []string{"bash", "-c", chaosStateCmd}}, nil, &out, io.Discard)
		return err
	})
	switch {
	case err != nil:
		o.State = []string{"exec failed: " + err.Error()}
	default:
		o.State = append(strings.Split(strings.TrimRight(out.String(), "\n"), "\n"), fmt.Sprintf("exit %d", st.Code))
	}
	var procs []api.Process
	err = retryServerErrors(ctx, func() (err error) {
		procs, err = cl.Processes(ctx, sbx)
		return err
	})
	if err != nil {
		o.Processes = []string{"ps failed: " + err.Error()}
	}
	for _, p := range procs {
		cmd := strings.Join(p.Args, " ")
		if strings.Contains(cmd, "app.py") || strings.Contains(cmd, "chaos-child") {
			o.Processes = append(o.Processes, cmd)
		}
	}
	sort.Strings(o.Processes)
	return o
}

// diffOutcome lists what differs between the golden outcome and got.
func diffOutcome(golden, got chaosOutcome) []string {
	var d []string
	cmp := func(what string, a, b []string) {
		if strings.Join(a, "\n") == strings.Join(b, "\n") {
			return
		}
		d = append(d, what+":")
		for i := 0; i < len(a) || i < len(b); i++ {
			var x, y string
			if i < len(a) {
				x = a[i]
			}
			if i < len(b) {
				y = b[i]
			}
			if x != y {
				d = append(d, fmt.Sprintf("  [%d] golden: %s", i, x), fmt.Sprintf("  [%d] got:    %s", i, y))
			}
		}
	}
	cmp("conversation", golden.Conversation, got.Conversation)
	cmp("state", golden.State, got.State)
	cmp("processes", golden.Processes, got.Processes)
	cmp("ledger", golden.Ledger, got.Ledger)
	return d
}
