/**
 * mysql2, the MySQL / MariaDB driver: an optional peer dependency, loaded here and nowhere else in
 * src/mysql (its promise API, `mysql2/promise`). Without it, importing `leasehold/mysql` throws an
 * InvalidArgumentError that says to `npm install mysql2`.
 */
import { createRequire } from 'node:module';
import type * as Mysql from 'mysql2/promise';
import { requirePeer } from '../core/peer.js';

const require = createRequire(import.meta.url);
// The package is looked for by its own name first, so a missing one is named as `npm install` takes it (not mysql2/promise).
requirePeer(require, 'mysql2', 'leasehold/mysql');
const driver = require('mysql2/promise') as typeof Mysql;

export const { createPool, createConnection } = driver;
export type Pool = Mysql.Pool;
export type PoolConnection = Mysql.PoolConnection;
export type PoolOptions = Mysql.PoolOptions;
export type ResultSetHeader = Mysql.ResultSetHeader;
export type RowDataPacket = Mysql.RowDataPacket;
