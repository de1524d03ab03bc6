// A Server-Sent Events reader for the lock service's tests: fetch, the stream parsed as it arrives
// (events and comments), and a way to wait for the next matching event.

export interface SseMessage {
  readonly event: string;
  readonly data: unknown;
}

export interface SseStream {
  readonly status: number;
  readonly headers: Headers;
  /** The error body when the status is not 200. */
  readonly body?: Record<string, unknown>;
  /** Every event received so far, in order. */
  readonly messages: SseMessage[];
  /** Comments received so far (`: keep-alive`), with the time each arrived (performance.now()). */
  readonly comments: { text: string; at: number }[];
  /** Resolves with the first event (received or to come) after index `from` that matches. */
  next(match: (m: SseMessage) => boolean, ms?: number, from?: number): Promise<SseMessage>;
  /** Resolves when the server ended the stream (or the connection broke). */
  readonly ended: Promise<void>;
  /** Disconnects. */
  close(): void;
}

export async function openSse(url: string, headers: Record<string, string> = {}): Promise<SseStream> {
  const stop = new AbortController();
  const res = await fetch(url, { headers: { accept: 'text/event-stream', ...headers }, signal: stop.signal });
  const messages: SseMessage[] = [];
  const comments: { text: string; at: number }[] = [];
  const waiting = new Set<() => void>();
  if (res.status !== 200) {
    const text = await res.text();
    return {
      status: res.status,
      headers: res.headers,
      body: text === '' ? {} : (JSON.parse(text) as Record<string, unknown>),
      messages,
      comments,
      next: () => Promise.reject(new Error(`no stream: ${res.status}`)),
      ended: Promise.resolve(),
      close: () => stop.abort(),
    };
  }
  const reader = res.body!.getReader();
  const decoder = new TextDecoder();
  let over = false;
  const ended = (async () => {
    let buffer = '';
    try {
      for (;;) {
        const { done, value } = await reader.read();
        if (done) break;
        buffer += decoder.decode(value, { stream: true });
        for (let end = buffer.indexOf('\n\n'); end >= 0; end = buffer.indexOf('\n\n')) {
          const block = buffer.slice(0, end);
          buffer = buffer.slice(end + 2);
          let event = 'message';
          const data: string[] = [];
          for (const line of block.split('\n')) {
            if (line.startsWith(':')) comments.push({ text: line.slice(1).trim(), at: performance.now() });
            else if (line.startsWith('event:')) event = line.slice(6).trim();
            else if (line.startsWith('data:')) data.push(line.slice(5).trimStart());
          }
          if (data.length > 0) messages.push({ event, data: JSON.parse(data.join('\n')) });
        }
        for (const wake of [...waiting]) wake();
      }
    } catch {
      // aborted by close(), or the connection broke
    } finally {
      over = true;
      for (const wake of [...waiting]) wake();
    }
  })();
  const next = (match: (m: SseMessage) => boolean, ms = 10_000, from = 0): Promise<SseMessage> =>
    new Promise((resolve, reject) => {
      const check = (): boolean => {
        const found = messages.slice(from).find(match);
        if (found) {
          finish();
          resolve(found);
          return true;
        }
        if (over) {
          finish();
          reject(new Error(`stream ended without the event; got ${JSON.stringify(messages)}`));
          return true;
        }
        return false;
      };
      const timer = setTimeout(() => {
        finish();
        reject(new Error(`no matching event within ${ms} ms; got ${JSON.stringify(messages)}`));
      }, ms);
      const wake = (): void => void check();
      const finish = (): void => {
        clearTimeout(timer);
        waiting.delete(wake);
      };
      waiting.add(wake);
      check();
    });
  return { status: 200, headers: res.headers, messages, comments, next, ended, close: () => stop.abort() };
}
