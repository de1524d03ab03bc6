/**
 * mysql2, the MySQL / MariaDB driver: an optional peer dependency, loaded here and nowhere else in
 * src/mysql (its promise API, `mysql2/promise`). Without it, importing `leasehold/mysql` throws an
 * InvalidArgumentError that says to `npm install mysql2`.
 */
import { createRequire } from 'node:module';
import type * as Mysql from 'mysql2/promise';
import { requirePeer } from '../core/peer.js';

const driver = requirePeer<typeof Mysql>(createRequire(import.meta.url), 'mysql2/promise', 'leasehold/mysql');

export const { createPool, createConnection } = driver;
export type Pool = Mysql.Pool;
export type PoolConnection = Mysql.PoolConnection;
export type PoolOptions = Mysql.PoolOptions;
export type ResultSetHeader = Mysql.ResultSetHeader;
export type RowDataPacket = Mysql.RowDataPacket;
