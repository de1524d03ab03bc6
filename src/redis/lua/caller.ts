import type { Conn } from '../conn/types.js';
import { replyCode } from '../errors.js';
import type { LuaLibrary } from './library.js';

/**
 * Calls the operations of a {@link LuaLibrary} on one connection, and keeps the library loaded.
 *
 * Functions first (single node): FCALL. An `ERR` reply (no such function: a server restarted
 * empty, a `FUNCTION FLUSH`; or a Redis without Functions) makes it look the library up
 * (`FUNCTION LIST`), load it if missing and try the call once more; a server that refuses FUNCTION
 * (Redis < 7, ACL) switches this connection to scripts (EVALSHA, EVAL on NOSCRIPT) for good, as
 * does a Cluster from the start. Nothing ran when the function was missing, and every operation is
 * safe to run twice (the same owner asks again).
 */
export class LibraryCaller {
  readonly #conn: Conn;
  readonly #lib: LuaLibrary;
  #functions: boolean;
  #loading: Promise<void> | undefined;

  constructor(conn: Conn, lib: LuaLibrary) {
    this.#conn = conn;
    this.#lib = lib;
    this.#functions = !conn.isCluster;
  }

  /** True while operations go through FCALL (false after falling back to scripts). */
  get usesFunctions(): boolean {
    return this.#functions;
  }

  /** One call of operation `name` (or `batch`). Never throws: a failure to send (a driver throwing, an unknown operation) is a rejection like any other. */
  send(name: string, keys: readonly string[], args: readonly string[]): Promise<unknown> {
    try {
      if (!this.#functions) return this.#lib.script(name).run(this.#conn, keys, args);
      return this.#conn.send('FCALL', [this.#lib.functionName(name), String(keys.length)].concat(keys, args));
    } catch (error) {
      return Promise.reject(error);
    }
  }

  /**
   * The failure path of a {@link send}: reload the library or switch to scripts and send again, or
   * fail (with the connection's error, `Conn.explain`).
   */
  async recover(error: unknown, name: string, keys: readonly string[], args: readonly string[]): Promise<unknown> {
    try {
      if (!this.#functions) throw error;
      const code = replyCode(error);
      if (code === 'NOPERM')
        this.#functions = false; // FCALL itself refused by an ACL: scripts may be allowed
      else if (code === 'ERR') await (this.#loading ??= this.#load().finally(() => (this.#loading = undefined)));
      else throw error;
      return await this.send(name, keys, args);
    } catch (e) {
      throw this.#conn.explain(e);
    }
  }

  /** Loads the library if the server does not have it; a server that refuses FUNCTION gets scripts instead. */
  async #load(): Promise<void> {
    try {
      const listed = await this.#conn.send('FUNCTION', ['LIST', 'LIBRARYNAME', this.#lib.name]);
      if (Array.isArray(listed) && listed.length > 0) return;
      await this.#conn.send('FUNCTION', ['LOAD', 'REPLACE', this.#lib.source]);
    } catch (error) {
      // A reply (unknown command, NOPERM, a read-only replica…) means FUNCTION is not for us; anything else is the connection's trouble.
      if (replyCode(error) === undefined) throw error;
      this.#functions = false;
    }
  }
}
