package session

import "fmt"

// buildContext returns the messages sent to the model: the conversation,
// with the oldest whole turns (a turn begins at a user message) left out
// while it is larger than budget characters, and a note saying how many
// messages were left out. The latest turn is always kept whole. The log is
// not touched: compaction only shapes what one request carries.
func buildContext(msgs []Message, budget int) (out []Message, compacted int) {
	size := func(ms []Message) int {
		n := 0
		for _, m := range ms {
			n += len(m.Text)
			for _, c := range m.ToolCalls {
				n += len(c.Name) + len(c.Input)
			}
		}
		return n
	}
	start := 0
	for size(msgs[start:]) > budget {
		next := -1
		for i := start + 1; i < len(msgs); i++ {
			if msgs[i].Role == "user" {
				next = i
				break
			}
		}
		if next < 0 {
			break
		}
		start = next
	}
	if start == 0 {
		return msgs, 0
	}
	note := Message{Role: "user", Text: fmt.Sprintf("[%d earlier messages of this session were compacted out of the context; the session log keeps them]", start)}
	return append([]Message{note}, msgs[start:]...), start
}
