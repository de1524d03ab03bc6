import { quiet, settleWithin, within } from './bounded.js';
import { CLOSE_TIMEOUT_MS, type Conn, type NodeRedisLike } from './types.js';

/** A node-redis client we own: close() (or quit()), waited for at most `timeoutMs`, then destroy(). */
async function closeNodeRedis(client: NodeRedisLike, timeoutMs: number): Promise<void> {
  let closing: Promise<unknown> | undefined;
  try {
    closing = client.close?.() ?? client.quit?.();
  } catch {
    // not open: nothing to say goodbye to
  }
  await settleWithin(closing, timeoutMs);
  try {
    client.destroy?.(); // a close() that did not finish in time is cut short; after one that did, nothing happens
  } catch {
    // already closed (older node-redis throws ClientClosedError)
  }
}

/** A {@link Conn} over a node-redis client (always the user's: leasehold opens ioredis clients only); `owned`: we close it. */
export function nodeRedisConn(client: NodeRedisLike, owned: boolean): Conn {
  if (owned) quiet(client);
  const conn: Conn = {
    isCluster: false,
    command(args) {
      if (!client.isReady) return Promise.reject(new Error('node-redis client is not ready'));
      return client.sendCommand([...args]);
    },
    send(name, args) {
      if (!client.isReady) return Promise.reject(new Error('node-redis client is not ready'));
      return client.sendCommand([name, ...args]);
    },
    explain: (error) => error,
    async subscribe(channel, onMessage, timeoutMs, signal) {
      const sub = client.duplicate();
      quiet(sub);
      let isReady = false;
      sub.on('ready', () => (isReady = true));
      sub.on('end', () => (isReady = false));
      sub.on('error', () => (isReady = false));
      try {
        await within(
          sub.connect().then(() => sub.subscribe(channel, (message) => onMessage(message, channel))),
          timeoutMs,
          signal,
          'subscribe',
        );
      } catch (error) {
        try {
          sub.destroy?.();
        } catch {
          // never opened
        }
        throw error;
      }
      isReady = true;
      return {
        get ready() {
          return isReady && sub.isReady;
        },
        async add(ch) {
          await sub.subscribe(ch, (message) => onMessage(message, ch));
        },
        async remove(ch) {
          if (ch === channel || !sub.isReady) return;
          await sub.unsubscribe(ch).catch(() => {});
        },
        close: (closeTimeoutMs = CLOSE_TIMEOUT_MS) => closeNodeRedis(sub, closeTimeoutMs),
      };
    },
    scanTargets: () => [conn],
    async close(timeoutMs = CLOSE_TIMEOUT_MS) {
      if (!owned) return;
      await closeNodeRedis(client, timeoutMs);
    },
  };
  return conn;
}
