import { Agent as HttpAgent, type ClientRequest, type IncomingMessage, request as httpRequest, type RequestOptions } from 'node:http';
import { Agent as HttpsAgent, request as httpsRequest } from 'node:https';
import { setMaxListeners } from 'node:events';
import { BackendUnavailableError, ClosedError, type LeaseholdError } from '../core/errors.js';
import { HTTP_DEFAULTS, type ResolvedHttpOptions } from './options.js';

/** The backend's name in errors and metrics. */
export const BACKEND_NAME = 'http';

/** A request's answer: its status and its JSON body (undefined when empty or not JSON). */
export interface Answer {
  readonly status: number;
  readonly body: unknown;
}

/** One request of the API. */
export interface Call {
  readonly method: 'GET' | 'POST' | 'DELETE';
  /** Path under the base URL (already percent-encoded), with its query: `/v1/locks?prefix=…`. */
  readonly path: string;
  readonly body?: unknown;
  readonly headers?: Readonly<Record<string, string>>;
  /** What the call is, for messages: `acquire`, `renew`… */
  readonly what: string;
  /** How long the server may hold the request on purpose (a long poll), on top of the timeout. */
  readonly holdMs?: number;
  /** The caller's own abort (core's, for a long poll). */
  readonly signal?: AbortSignal;
}

/**
 * The wire: JSON requests over one keep-alive agent (node:http or node:https, so a private CA can be
 * trusted per client), each bounded by a timeout, all cut at once by `close()`. Failures come out as
 * leasehold errors, never as Node's: no answer, a reset, a refused connection or an unreadable answer
 * is a `BackendUnavailableError` naming the call; after `close()`, a `ClosedError`.
 */
export class Transport {
  readonly #o: ResolvedHttpOptions;
  readonly #agent: HttpAgent;
  readonly #request: (url: URL, options: RequestOptions) => ClientRequest;
  readonly #closing = new AbortController();
  readonly #auth: Record<string, string>;
  /** The URL's path without its trailing slash: `` or `/locks`. */
  readonly #basePath: string;

  constructor(options: ResolvedHttpOptions) {
    this.#o = options;
    // keepAlive: one connection serves a client's calls one after another (a free socket is unref'd by the agent).
    this.#agent = options.secure
      ? new HttpsAgent({ keepAlive: true, ...(options.ca !== undefined && { ca: options.ca }) })
      : new HttpAgent({ keepAlive: true });
    this.#request = options.secure ? httpsRequest : httpRequest;
    // Every request in flight listens to it (one listener each): as many as requests, not a leak.
    setMaxListeners(0, this.#closing.signal);
    this.#basePath = options.base.pathname.replace(/\/+$/, '');
    this.#auth = options.token === undefined ? {} : { authorization: `Bearer ${options.token}` };
  }

  /** Aborted by `close()`. */
  get closing(): AbortSignal {
    return this.#closing.signal;
  }

  /** The base URL (no credentials), for messages. */
  get where(): string {
    return this.#o.base.href;
  }

  /** Sends one request and reads its whole answer. */
  send(call: Call): Promise<Answer> {
    return this.#open(call, false).then((r) => r as Answer);
  }

  /**
   * Opens a streaming GET (Server-Sent Events): resolves with the response once a 200 arrived (its
   * body still flowing); any other status is read and resolved as an Answer. `stop()` ends it.
   */
  async stream(call: Omit<Call, 'method' | 'body' | 'holdMs'>): Promise<{ response: IncomingMessage; stop: () => void } | Answer> {
    return this.#open({ ...call, method: 'GET', headers: { accept: 'text/event-stream', ...call.headers } }, true);
  }

  /** Cuts every request in flight and every stream, and closes the agent's connections. */
  close(): void {
    this.#closing.abort(new ClosedError(`${BACKEND_NAME} backend`));
    this.#agent.destroy();
  }

  #open(call: Call, streaming: boolean): Promise<Answer | { response: IncomingMessage; stop: () => void }> {
    if (this.#closing.signal.aborted) return Promise.reject(new ClosedError(`${BACKEND_NAME} backend`));
    const signal = call.signal ? AbortSignal.any([call.signal, this.#closing.signal]) : this.#closing.signal;
    const payload = call.body === undefined ? undefined : Buffer.from(JSON.stringify(call.body));
    const headers: Record<string, string> = {
      accept: 'application/json',
      ...this.#auth,
      ...call.headers,
      ...(payload && { 'content-type': 'application/json', 'content-length': String(payload.length) }),
    };
    const url = new URL(this.#o.base.origin + this.#basePath + call.path);
    const ms = this.#o.timeoutMs + (call.holdMs ?? 0);
    return new Promise((resolve, reject) => {
      let settled = false;
      const fail = (error: LeaseholdError): void => {
        if (settled) return;
        settled = true;
        clearTimeout(timer);
        req.destroy();
        reject(error);
      };
      const timer = setTimeout(() => fail(unavailable(`${call.what} got no answer from ${this.where} within ${ms} ms`)), ms);
      timer.unref();
      const req = this.#request(url, { method: call.method, headers, agent: this.#agent, signal });
      req.on('error', (error) => {
        if (this.#closing.signal.aborted) fail(new ClosedError(`${BACKEND_NAME} backend`, { cause: error }));
        else if (call.signal?.aborted) fail(unavailable(`${call.what} was aborted by its caller`, error));
        else fail(unavailable(`${call.what} failed: ${describeNetError(error)} (${this.where})`, error));
      });
      req.on('response', (res) => {
        if (streaming && res.statusCode === 200) {
          settled = true;
          clearTimeout(timer);
          resolve({ response: res, stop: () => req.destroy() });
          return;
        }
        const chunks: Buffer[] = [];
        let size = 0;
        res.on('data', (chunk: Buffer) => {
          size += chunk.length;
          if (size > HTTP_DEFAULTS.maxAnswerBytes) fail(unavailable(`${call.what}: the answer is over ${HTTP_DEFAULTS.maxAnswerBytes} bytes`));
          else chunks.push(chunk);
        });
        res.on('error', (error) => fail(unavailable(`${call.what}: the answer was cut off: ${describeNetError(error)}`, error)));
        res.on('end', () => {
          if (settled) return;
          const status = res.statusCode ?? 0;
          const text = Buffer.concat(chunks).toString('utf8');
          let body: unknown;
          if (text.length > 0 && /\bjson\b/i.test(res.headers['content-type'] ?? '')) {
            try {
              body = JSON.parse(text);
            } catch (error) {
              fail(unavailable(`${call.what}: the answer (HTTP ${status}) is not valid JSON`, error));
              return;
            }
          }
          settled = true;
          clearTimeout(timer);
          resolve({ status, body });
        });
      });
      req.end(payload);
    });
  }
}

export function unavailable(message: string, cause?: unknown): BackendUnavailableError {
  return new BackendUnavailableError(BACKEND_NAME, message, cause === undefined ? undefined : { cause });
}

/** Node's network error, in a few words (its code when it has one: ECONNREFUSED, ECONNRESET…). */
function describeNetError(error: unknown): string {
  const code = (error as { code?: unknown }).code;
  const message = error instanceof Error ? error.message : String(error);
  return typeof code === 'string' && !message.includes(code) ? `${code} ${message}` : message;
}
