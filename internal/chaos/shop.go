package chaos

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"time"
)

// Shop is the outside world: POST /orders books an order; a repeated
// Idempotency-Key books nothing and gets the first answer. The first order
// of item hold is booked, then its answer waits for release.
type Shop struct {
	srv     *http.Server
	Addr    string // host:port on 127.0.0.1
	Port    int
	hold    string
	Arrived chan struct{} // closed when the held order arrived
	Release chan struct{} // close to answer the held order

	mu     sync.Mutex
	orders []string
	keys   map[string][]byte
	dedup  int
	held   bool
}

func StartShop(hold string) (*Shop, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	s := &Shop{Addr: ln.Addr().String(), Port: ln.Addr().(*net.TCPAddr).Port, hold: hold,
		Arrived: make(chan struct{}), Release: make(chan struct{}), keys: map[string][]byte{}}
	s.srv = &http.Server{Handler: http.HandlerFunc(s.serve), ReadHeaderTimeout: 10 * time.Second}
	go s.srv.Serve(ln)
	return s, nil
}

func (s *Shop) serve(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != "/orders" || r.Method != "POST" {
		http.NotFound(w, r)
		return
	}
	var o struct {
		Item string `json:"item"`
	}
	if err := json.NewDecoder(io.LimitReader(r.Body, 1<<16)).Decode(&o); err != nil || o.Item == "" {
		http.Error(w, "bad order", http.StatusBadRequest)
		return
	}
	key := r.Header.Get("Idempotency-Key")
	s.mu.Lock()
	if prev, ok := s.keys[key]; ok && key != "" {
		s.dedup++
		s.mu.Unlock()
		w.Write(prev)
		return
	}
	s.orders = append(s.orders, o.Item)
	resp := fmt.Appendf(nil, `{"order":%d,"item":%q}`, len(s.orders), o.Item)
	if key != "" {
		s.keys[key] = resp
	}
	holdIt := o.Item == s.hold && !s.held
	if holdIt {
		s.held = true
	}
	s.mu.Unlock()
	if holdIt {
		close(s.Arrived)
		<-s.Release
	}
	w.Header().Set("Content-Type", "application/json")
	w.Write(resp)
}

func (s *Shop) Items() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.orders...)
}

func (s *Shop) Deduplicated() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.dedup
}

func (s *Shop) Close() {
	select {
	case <-s.Release:
	default:
		close(s.Release)
	}
	s.srv.Close()
}
