// A TCP proxy on loopback in front of the daemon that a test can cut: every
// open connection is destroyed at once, as a network break or a daemon
// restart would. It records the request heads it forwarded, so a test can
// see what a reconnecting client sent (Last-Event-ID).
import net from "node:net";

export class CuttableProxy {
  readonly heads: string[] = [];
  connections = 0;
  #server: net.Server;
  #open = new Set<net.Socket>();

  private constructor(server: net.Server) {
    this.#server = server;
  }

  static async start(target: string): Promise<CuttableProxy> {
    const [host, port] = splitHostPort(target);
    const server = net.createServer();
    const p = new CuttableProxy(server);
    server.on("connection", (client) => {
      p.connections++;
      const upstream = net.connect(port, host);
      p.#open.add(client);
      p.#open.add(upstream);
      let head = "";
      client.on("data", (d: Buffer) => {
        if (head.length < 8192 && !head.includes("\r\n\r\n")) {
          head += d.toString("latin1");
          const end = head.indexOf("\r\n\r\n");
          if (end >= 0) p.heads.push(head.slice(0, end));
        }
        upstream.write(d);
      });
      upstream.on("data", (d: Buffer) => client.write(d));
      const close = () => {
        client.destroy();
        upstream.destroy();
        p.#open.delete(client);
        p.#open.delete(upstream);
      };
      client.on("close", close).on("error", close);
      upstream.on("close", close).on("error", close);
    });
    await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
    return p;
  }

  get addr(): string {
    const a = this.#server.address() as net.AddressInfo;
    return `127.0.0.1:${a.port}`;
  }

  /** Destroys every open connection (both sides). */
  cut(): void {
    for (const s of this.#open) s.destroy();
    this.#open.clear();
  }

  async close(): Promise<void> {
    this.cut();
    await new Promise<void>((resolve) => this.#server.close(() => resolve()));
  }
}

function splitHostPort(addr: string): [string, number] {
  const u = new URL(addr.includes("://") ? addr : "http://" + addr);
  return [u.hostname, Number(u.port || 80)];
}
