// The LISTEN connection manager, driven through a scripted connection (the wire behaviour is
// covered against the real server in backend.test.ts and the conformance suite).
import { EventEmitter } from 'node:events';
import { describe, expect, it } from 'vitest';
import { Listener, type ListenConnection } from '../../src/postgres/listener.js';
import { eventually, sleep } from '../helpers/env.js';

class ScriptedConnection extends EventEmitter {
  readonly queries: string[] = [];
  /** `processID`: the pid of the connection's BackendKeyData (a direct connection's equals the server's answer). */
  constructor(
    private readonly pids: number[],
    readonly processID?: number,
  ) {
    super();
  }
  async query(text: string): Promise<unknown> {
    this.queries.push(text);
    const pid = this.pids.length > 1 ? this.pids.shift()! : this.pids[0]!;
    const answer = { rows: [{ pid }] };
    return text.startsWith('LISTEN') ? [{ rows: [] }, answer] : answer;
  }
  notify(payload: string, channel = 'ch'): void {
    this.emit('notification', { channel, payload });
  }
}

function listenerOver(connections: ScriptedConnection[]): { listener: Listener; disposed: ScriptedConnection[] } {
  const disposed: ScriptedConnection[] = [];
  let next = 0;
  const listener = new Listener({
    channel: 'ch',
    connect: async () => connections[next++]! as unknown as ListenConnection,
    dispose: async (c) => {
      disposed.push(c as unknown as ScriptedConnection);
    },
  });
  return { listener, disposed };
}

describe('postgres LISTEN connection', () => {
  it('dispatches by key, and by queue position when the notification names one', async () => {
    const conn = new ScriptedConnection([7]);
    const { listener } = listenerOver([conn]);
    const calls: string[] = [];
    await listener.add('k', () => calls.push('plain'));
    await listener.add('k', () => calls.push('seq3'), 3n);
    await listener.add('k', () => calls.push('seq5'), 5n);
    await listener.add('other', () => calls.push('other'));
    conn.notify('4:k');
    expect(calls.sort()).toEqual(['plain', 'seq3']);
    calls.length = 0;
    conn.notify('*:k');
    expect(calls.sort()).toEqual(['plain', 'seq3', 'seq5']);
    calls.length = 0;
    conn.notify('*:k:with:colons');
    conn.notify('*:k', 'another-channel');
    expect(calls).toEqual([]);
    await listener.close();
  });

  it('reconnects after the connection drops and wakes every subscriber once it listens again', async () => {
    const first = new ScriptedConnection([7]);
    const second = new ScriptedConnection([8]);
    const { listener, disposed } = listenerOver([first, second]);
    let woken = 0;
    await listener.add('k', () => woken++);
    first.emit('end');
    expect(disposed).toContain(first);
    expect(await eventually(() => woken === 1 && second.queries.length > 0, 5_000)).toBe(true);
    second.notify('*:k');
    expect(woken).toBe(2);
    await listener.close();
  });

  it('stops listening when another server process answers (a transaction-mode pooler): later adds reject', async () => {
    const conn = new ScriptedConnection([7, 7, 9]);
    const { listener, disposed } = listenerOver([conn]);
    let woken = 0;
    await listener.add('k', () => woken++); // LISTEN on 7, check answered by 7
    await eventually(() => conn.queries.length === 2, 1_000);
    await listener.add('k', () => woken++); // check answered by 9
    expect(await eventually(() => disposed.includes(conn), 1_000)).toBe(true);
    expect(woken).toBe(2);
    await expect(listener.add('k', () => {})).rejects.toThrow(/listenConnectionString/);
    await listener.close();
  });

  it('a connection whose BackendKeyData names the process that ran LISTEN is direct: no pooler check on later adds', async () => {
    const direct = new ScriptedConnection([7], 7);
    const { listener } = listenerOver([direct]);
    for (let i = 0; i < 5; i++) await listener.add(`k${i}`, () => {});
    await sleep(20);
    expect(direct.queries).toHaveLength(1); // the LISTEN alone
    await listener.close();

    // a pooler's own key (PgBouncer sends one): every add still checks, and the pooler is caught
    const pooled = new ScriptedConnection([7, 7, 9], 123_456_789);
    const other = listenerOver([pooled]);
    await other.listener.add('k', () => {});
    expect(await eventually(() => pooled.queries.length === 2, 1_000)).toBe(true);
    await other.listener.add('k', () => {});
    expect(await eventually(() => other.disposed.includes(pooled), 1_000)).toBe(true);
    await other.listener.close();
  });
});
