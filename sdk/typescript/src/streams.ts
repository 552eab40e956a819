// Readers of the API's two streaming formats: newline-delimited JSON (exec
// output, followed sandbox events, checkpoint progress) and Server-Sent
// Events (a session's event stream). Both read a fetch Response body as it
// arrives; neither buffers more than one line or one event.

/** Yields the lines of a byte stream (without "\n" or "\r\n"). */
export async function* lines(body: ReadableStream<Uint8Array>): AsyncGenerator<string> {
  const decoder = new TextDecoder();
  const reader = body.getReader();
  let buf = "";
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buf += decoder.decode(value, { stream: true });
      let i: number;
      while ((i = buf.indexOf("\n")) >= 0) {
        let line = buf.slice(0, i);
        buf = buf.slice(i + 1);
        if (line.endsWith("\r")) line = line.slice(0, -1);
        yield line;
      }
    }
    buf += decoder.decode();
    if (buf.length > 0) yield buf.endsWith("\r") ? buf.slice(0, -1) : buf;
  } finally {
    // An early return (break in a for await) cancels the body, which
    // closes the connection.
    await reader.cancel().catch(() => {});
  }
}

/** Yields each JSON value of a newline-delimited JSON stream. */
export async function* ndjson<T>(body: ReadableStream<Uint8Array>): AsyncGenerator<T> {
  for await (const line of lines(body)) {
    if (line.trim() === "") continue;
    yield JSON.parse(line) as T;
  }
}

/** One Server-Sent Event. */
export interface SSEMessage {
  /** The event's "id:" field; undefined when it had none. */
  id: string | undefined;
  /** The "event:" field ("message" when absent, as in the spec). */
  event: string;
  data: string;
}

/**
 * Yields the events of a text/event-stream body (WHATWG HTML §9.2 parsing:
 * "field: value" lines, a blank line dispatches, lines starting with ":"
 * are comments). An event's id is its own, not carried over from an
 * earlier event: the API sends ids only on durable events.
 */
export async function* sse(body: ReadableStream<Uint8Array>): AsyncGenerator<SSEMessage> {
  let data: string[] = [];
  let event = "";
  let id: string | undefined;
  for await (const line of lines(body)) {
    if (line === "") {
      if (data.length > 0) yield { id, event: event || "message", data: data.join("\n") };
      data = [];
      event = "";
      id = undefined;
      continue;
    }
    if (line.startsWith(":")) continue;
    const colon = line.indexOf(":");
    const field = colon < 0 ? line : line.slice(0, colon);
    let value = colon < 0 ? "" : line.slice(colon + 1);
    if (value.startsWith(" ")) value = value.slice(1);
    switch (field) {
      case "data":
        data.push(value);
        break;
      case "event":
        event = value;
        break;
      case "id":
        if (!value.includes("\0")) id = value;
        break;
    }
  }
}
