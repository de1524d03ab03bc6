import net from 'node:net';
import { afterEach, describe, expect, it } from 'vitest';
import { tcpEndpoints, viaPorts } from '../../src/verify/endpoints.js';
import { DelayProxy } from '../../src/verify/proxy.js';
import { eventually, sleep } from '../helpers/env.js';

const closers: (() => Promise<void> | void)[] = [];
afterEach(async () => {
  for (const close of closers.splice(0).reverse()) await close();
});

/** A server that records what it receives and answers every chunk with `ok`. */
async function recorder(): Promise<{ port: number; received: () => string }> {
  let received = '';
  const sockets = new Set<net.Socket>();
  const server = net.createServer((s) => {
    sockets.add(s);
    s.on('data', (d) => {
      received += d.toString();
      s.write('ok');
    });
    s.on('error', () => {});
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  closers.push(
    () =>
      new Promise<void>((r) => {
        for (const s of sockets) s.destroy();
        server.close(() => r());
      }),
  );
  return { port: (server.address() as net.AddressInfo).port, received: () => received };
}

describe('verify: the delaying TCP proxy', () => {
  it('holds what the client sends, lets answers through, then delivers in order', async () => {
    const server = await recorder();
    const proxy = await DelayProxy.start({ host: '127.0.0.1', port: server.port });
    closers.push(() => proxy.close());
    const client = net.connect({ host: '127.0.0.1', port: proxy.port });
    closers.push(() => void client.destroy());
    let answers = '';
    client.on('data', (d) => (answers += d.toString()));
    await new Promise<void>((r) => client.once('connect', () => r()));

    client.write('a');
    expect(await eventually(() => server.received() === 'a' && answers === 'ok')).toBe(true);
    proxy.hold();
    client.write('b');
    client.write('c');
    await sleep(150);
    expect(server.received()).toBe('a'); // sent in time, not delivered
    const held = proxy.deliver();
    expect(held).toBe(2);
    expect(await eventually(() => server.received() === 'abc')).toBe(true);
    client.write('d');
    expect(await eventually(() => server.received() === 'abcd')).toBe(true);
  });

  it('still delivers held bytes after the client hung up', async () => {
    const server = await recorder();
    const proxy = await DelayProxy.start({ host: '127.0.0.1', port: server.port });
    closers.push(() => proxy.close());
    const client = net.connect({ host: '127.0.0.1', port: proxy.port });
    await new Promise<void>((r) => client.once('connect', () => r()));
    client.write('x');
    expect(await eventually(() => server.received() === 'x')).toBe(true);
    proxy.hold();
    client.end('late');
    await sleep(100);
    expect(server.received()).toBe('x');
    proxy.deliver();
    expect(await eventually(() => server.received() === 'xlate')).toBe(true);
  });

  it('finds the TCP endpoints of coordinator and store URLs and points them at other ports', () => {
    expect(tcpEndpoints('redis://user:pw@db.example:6380/2')).toEqual([{ host: 'db.example', port: 6380 }]);
    expect(viaPorts('redis://user:pw@db.example:6380/2', [1234])).toBe('redis://user:pw@127.0.0.1:1234/2');
    expect(tcpEndpoints('postgres://u@h/db?schema=s')).toEqual([{ host: 'h', port: 5432 }]);
    expect(viaPorts('postgres://u@h/db?schema=s', [5])).toBe('postgres://u@127.0.0.1:5/db?schema=s');
    expect(tcpEndpoints('postgresql://root@/test?host=/var/run/postgresql')).toEqual([]);
    expect(tcpEndpoints('etcd://a:1,b:2')).toEqual([
      { host: 'a', port: 1 },
      { host: 'b', port: 2 },
    ]);
    expect(viaPorts('etcd://a:1,b:2', [7, 8])).toBe('etcd://127.0.0.1:7,127.0.0.1:8');
    expect(tcpEndpoints('sqlite:/tmp/x.db')).toEqual([]);
    expect(tcpEndpoints('rediss://h:6379')).toEqual([]);
  });
});
