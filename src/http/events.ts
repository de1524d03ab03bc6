import type { IncomingMessage } from 'node:http';
import { answerError } from './errors.js';
import { HTTP_DEFAULTS } from './options.js';
import type { Transport } from './transport.js';

/** The longest line of an event stream kept in memory; a longer one ends the stream (it is not the service). */
const MAX_LINE_CHARS = 1024 * 1024;

/**
 * 60 s without a byte (the server sends `: keep-alive` comments when idle): the connection is taken
 * for dead (a peer gone without a FIN) and opened again.
 */
const IDLE_MS = 60_000;

/**
 * Reads Server-Sent Events (the `event:` / `data:` lines of the WHATWG format, comments skipped)
 * from `stream`, calling `onEvent` for each complete event and `onBytes` for anything received.
 */
export function readEvents(stream: IncomingMessage, onEvent: (type: string, data: string) => void, onBytes: () => void = () => {}): void {
  stream.setEncoding('utf8');
  let buffer = '';
  let type = '';
  let data: string[] = [];
  stream.on('data', (chunk: string) => {
    onBytes();
    buffer += chunk;
    for (let nl = buffer.indexOf('\n'); nl >= 0; nl = buffer.indexOf('\n')) {
      const line = buffer.slice(0, nl).replace(/\r$/, '');
      buffer = buffer.slice(nl + 1);
      if (line === '') {
        if (data.length > 0) onEvent(type || 'message', data.join('\n'));
        type = '';
        data = [];
      } else if (line.startsWith(':')) {
        // a comment (the server's keep-alive)
      } else {
        const colon = line.indexOf(':');
        const field = colon < 0 ? line : line.slice(0, colon);
        const value = colon < 0 ? '' : line.slice(colon + 1).replace(/^ /, '');
        if (field === 'event') type = value;
        else if (field === 'data') data.push(value);
      }
    }
    if (buffer.length > MAX_LINE_CHARS) stream.destroy();
  });
}

/**
 * The change events of single keys, from the service's event stream (`GET /v1/events?prefix=KEY`,
 * filtered here to the key itself): one stream per listened key, opened again after it drops (the
 * listener is then told, since a change may have been missed meanwhile) until the listener stops or
 * the backend closes.
 */
export class KeyEvents {
  readonly #transport: Transport;

  constructor(transport: Transport) {
    this.#transport = transport;
  }

  /** Calls `onChange` on each event of `key` and after each reconnection; resolves once the stream is open. */
  async listen(key: string, onChange: () => void): Promise<() => void> {
    const transport = this.#transport;
    let stopped = false;
    let stopCurrent: (() => void) | undefined;
    let retry: ReturnType<typeof setTimeout> | undefined;
    let idle: ReturnType<typeof setTimeout> | undefined;

    const connect = async (): Promise<void> => {
      const opened = await transport.stream({ path: `/v1/events?prefix=${encodeURIComponent(key)}`, what: 'events' });
      if ('status' in opened) throw answerError(opened, 'events', transport.where, 'prefix');
      if (stopped) {
        opened.stop();
        return;
      }
      stopCurrent = opened.stop;
      const alive = (): void => {
        clearTimeout(idle);
        idle = setTimeout(opened.stop, IDLE_MS);
        idle.unref();
      };
      alive();
      readEvents(
        opened.response,
        (type, data) => {
          if (type === 'change' && eventKey(data) === key) onChange();
        },
        alive,
      );
      opened.response.on('error', () => {}); // a reset ends the stream: 'close' follows
      opened.response.on('close', () => {
        clearTimeout(idle);
        stopCurrent = undefined;
        again();
      });
    };
    const again = (): void => {
      if (stopped || transport.closing.aborted) return;
      retry = setTimeout(() => {
        connect().then(
          () => {
            if (!stopped) onChange();
          },
          () => again(),
        );
      }, HTTP_DEFAULTS.reconnectMs); // ref'd, as the stream's socket is: a watch holds the process until it stops
    };

    await connect();
    return () => {
      stopped = true;
      clearTimeout(retry);
      clearTimeout(idle);
      stopCurrent?.();
    };
  }
}

/** The `key` of a change event's JSON data, or undefined. */
function eventKey(data: string): string | undefined {
  try {
    const parsed = JSON.parse(data) as { key?: unknown };
    return typeof parsed?.key === 'string' ? parsed.key : undefined;
  } catch {
    return undefined;
  }
}
