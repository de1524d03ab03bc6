import net from 'node:net';

/**
 * A TCP proxy in front of one server, for one worker: the delay nemesis. While it holds, the
 * bytes the worker sends (client → server) are buffered — sent in time, not yet delivered — and
 * when the hold ends they are delivered in order, as a congested or partitioned network would
 * deliver them late. Server → client bytes always flow. Each upstream connection is opened when
 * the worker connects; when either side closes, the other is closed after the held bytes are out.
 *
 * One proxy per worker per TCP service (the coordinator's hosts, and the fence's store when it is
 * a server), so the harness knows whose bytes it holds.
 */
export class DelayProxy {
  readonly #server: net.Server;
  readonly #target: { host: string; port: number };
  readonly #pipes = new Set<Pipe>();
  #holding = false;
  #heldBytes = 0;

  private constructor(server: net.Server, target: { host: string; port: number }) {
    this.#server = server;
    this.#target = target;
    server.on('connection', (socket) => this.#pipes.add(new Pipe(socket, target, this)));
  }

  /** Listens on a free port of 127.0.0.1 and forwards to `target`. */
  static async start(target: { host: string; port: number }): Promise<DelayProxy> {
    const server = net.createServer({ noDelay: true });
    await new Promise<void>((resolve, reject) => {
      server.once('error', reject);
      server.listen(0, '127.0.0.1', () => {
        server.off('error', reject);
        resolve();
      });
    });
    // After listening, an accept error (e.g. EMFILE) must not crash verify: the worker's connection
    // attempt fails, which the run records as an error of that worker.
    server.on('error', () => {});
    server.unref();
    return new DelayProxy(server, target);
  }

  get port(): number {
    return (this.#server.address() as net.AddressInfo).port;
  }

  get target(): { host: string; port: number } {
    return this.#target;
  }

  get holding(): boolean {
    return this.#holding;
  }

  /** Starts holding client → server bytes. */
  hold(): void {
    this.#holding = true;
    this.#heldBytes = 0;
  }

  /** Delivers everything held, in order, and lets bytes flow again. Returns how many bytes were held. */
  deliver(): number {
    this.#holding = false;
    for (const p of this.#pipes) p.flush();
    return this.#heldBytes;
  }

  /** @internal counts a held chunk */
  held(bytes: number): void {
    this.#heldBytes += bytes;
  }

  /** @internal */
  forget(pipe: Pipe): void {
    this.#pipes.delete(pipe);
  }

  async close(): Promise<void> {
    this.#holding = false;
    for (const p of this.#pipes) p.destroy();
    await new Promise<void>((resolve) => this.#server.close(() => resolve()));
  }
}

/** One proxied connection. */
class Pipe {
  readonly #client: net.Socket;
  readonly #upstream: net.Socket;
  readonly #proxy: DelayProxy;
  readonly #queue: Buffer[] = [];
  /** The worker closed its side: the upstream is ended once the held bytes are out. */
  #clientGone = false;

  constructor(client: net.Socket, target: { host: string; port: number }, proxy: DelayProxy) {
    this.#client = client;
    this.#proxy = proxy;
    this.#upstream = net.connect({ host: target.host, port: target.port, noDelay: true });
    client.setNoDelay(true);
    client.on('data', (chunk: Buffer) => {
      if (this.#proxy.holding || this.#queue.length > 0) {
        this.#queue.push(chunk);
        this.#proxy.held(chunk.length);
      } else this.#upstream.write(chunk);
    });
    const clientGone = (): void => {
      if (this.#clientGone) return;
      this.#clientGone = true;
      // Bytes already sent are still delivered (late) when the hold ends, even if the sender hung up.
      if (this.#queue.length === 0) this.#upstream.end();
    };
    client.on('end', clientGone);
    client.on('close', clientGone);
    client.on('error', clientGone);
    this.#upstream.on('data', (chunk: Buffer) => {
      if (!client.destroyed) client.write(chunk);
    });
    const upstreamGone = (): void => this.destroy();
    this.#upstream.on('end', () => client.end());
    this.#upstream.on('error', upstreamGone);
    this.#upstream.on('close', upstreamGone);
  }

  flush(): void {
    for (const chunk of this.#queue.splice(0)) if (!this.#upstream.destroyed) this.#upstream.write(chunk);
    if (this.#clientGone) this.#upstream.end();
  }

  destroy(): void {
    this.#queue.length = 0;
    this.#client.destroy();
    this.#upstream.destroy();
    this.#proxy.forget(this);
  }
}
