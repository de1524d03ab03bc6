/**
 * pg, the PostgreSQL driver: an optional peer dependency, loaded here and nowhere else in
 * src/postgres (`import * as pg from './driver.js'` reads like `import pg from 'pg'`). Without it,
 * importing `leasehold/postgres` throws an InvalidArgumentError that says to `npm install pg`.
 */
import { createRequire } from 'node:module';
import type Pg from 'pg';
import { requirePeer } from '../core/peer.js';

const driver = requirePeer<typeof Pg>(createRequire(import.meta.url), 'pg', 'leasehold/postgres');

export const { Pool, Client } = driver;
export type Pool = Pg.Pool;
export type Client = Pg.Client;
export type PoolClient = Pg.PoolClient;
export type PoolConfig = Pg.PoolConfig;
export type ClientConfig = Pg.ClientConfig;
