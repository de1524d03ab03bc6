import { createHash } from 'node:crypto';
import { LuaScript } from './script.js';

/**
 * One operation of a {@link LuaLibrary}: the body of a Lua function of (KEYS, ARGV), named, and
 * typed as redis-semaphore's `createEval<[args], reply>`: `Keys` and `Args` are its KEYS and ARGV
 * (tuples of strings), `Reply` what it returns as the driver hands it over. The types exist only at
 * compile time; the module that defines an operation documents them beside its Lua.
 */
export interface LuaOp<Keys extends readonly string[], Args extends readonly string[], Reply> {
  /** The function's name in the library (`[a-z][a-z0-9_]*`). */
  readonly name: string;
  /** What the call is, in messages: `acquire`, `session keep-alive`… */
  readonly what: string;
  /** The Lua body; it sees the library's prelude and KEYS and ARGV as its arguments. */
  readonly body: string;
  /** Compile-time only (never set): carries the types. */
  readonly types?: { readonly keys: Keys; readonly args: Args; readonly reply: Reply };
}

/** Any operation, whatever its types (what a library holds). */
export type AnyLuaOp = LuaOp<readonly string[], readonly string[], unknown>;

/** Defines an operation (see {@link LuaOp}); the type arguments are its KEYS, its ARGV and its reply. */
export function luaOp<Keys extends readonly string[], Args extends readonly string[], Reply>(
  name: string,
  what: string,
  body: string,
): LuaOp<Keys, Args, Reply> {
  if (!/^[a-z][a-z0-9_]*$/.test(name)) throw new TypeError(`luaOp: bad name ${JSON.stringify(name)}`);
  return Object.freeze({ name, what, body });
}

/**
 * Runs several operations of a {@link LuaLibrary} in one call, in order, each isolated: an error
 * raised by one (a `redis.call` refused, a bug) becomes that operation's error reply and the others
 * go on. ARGV: count, then per operation its name, number of keys, number of arguments and the
 * arguments; KEYS: the keys of all operations, in order. Reply: one reply per operation.
 */
const BATCH_LUA = `
local function op_batch(KEYS, ARGV)
  local out = {}
  local ki, ai = 1, 2
  -- one KEYS and one ARGV table for all operations, refilled (the rest cleared) for each
  local k, a, kn, an = {}, {}, 0, 0
  for i = 1, tonumber(ARGV[1]) do
    local f, nk, na = OPS[ARGV[ai]], tonumber(ARGV[ai + 1]), tonumber(ARGV[ai + 2])
    for j = 1, nk do k[j] = KEYS[ki + j - 1] end
    for j = nk + 1, kn do k[j] = nil end
    for j = 1, na do a[j] = ARGV[ai + 2 + j] end
    for j = na + 1, an do a[j] = nil end
    kn, an = nk, na
    ki, ai = ki + nk, ai + 3 + na
    local ok, r = pcall(f, k, a)
    if not ok then
      -- a refused redis.call comes as its error reply ('WRONGTYPE …'; a table on newer servers): keep its code
      if type(r) == 'table' and r.err then r = r.err end
      r = tostring(r)
      if not string.find(r, '^%u[%u_]*%s') then r = 'ERR ' .. r end
      r = { err = r }
    elseif r == nil then
      r = false
    end
    out[i] = r
  end
  return out
end`;

/** The name of the operation that runs several in one call (see BATCH_LUA). */
export const BATCH = 'batch';

/**
 * The Lua operations of a backend, shipped two ways from the same text:
 * - as one Redis Functions library (Redis 7+): `FUNCTION LOAD` once per server, then `FCALL`. The
 *   shared helpers (the prelude) are built when the library loads, not again on every call as in a
 *   script;
 * - as one script per operation, run with EVALSHA (EVAL on NOSCRIPT), where the server has no
 *   Functions, refuses FUNCTION, or is a Redis Cluster (a library would have to be loaded on every
 *   master).
 * The library and function names carry a digest of the source, so two leasehold versions on one
 * server never call each other's code. A `batch` operation runs several operations in one call
 * (see `LuaRunner`).
 */
export class LuaLibrary {
  /** Library name: `<base>_<digest of the source>`. */
  readonly name: string;
  /** The text given to FUNCTION LOAD. */
  readonly source: string;
  readonly #functions = new Map<string, string>();
  readonly #scripts = new Map<string, LuaScript>();

  /** `prelude`: the helpers every operation sees, in order; `operations`: the library's operations. */
  constructor(base: string, prelude: readonly string[], operations: readonly AnyLuaOp[]) {
    if (!/^[a-z][a-z0-9_]*$/.test(base)) throw new TypeError(`LuaLibrary: bad name ${JSON.stringify(base)}`);
    const names = operations.map((op) => op.name);
    if (new Set([...names, BATCH]).size !== names.length + 1) throw new TypeError(`LuaLibrary ${base}: operation names must be unique and not ${BATCH}`);
    const helpers = prelude.join('');
    const defs = operations.map((op) => `local function op_${op.name}(KEYS, ARGV)\n${op.body}\nend`).join('\n');
    const table = `local OPS = { ${names.map((op) => `${op} = op_${op}`).join(', ')} }`;
    const version = createHash('sha1').update(`${helpers}\n${defs}\n${table}\n${BATCH_LUA}`).digest('hex').slice(0, 12);
    this.name = `${base}_${version}`;
    const registrations = [...names, BATCH].map((op) => {
      const fn = `${this.name}_${op}`;
      this.#functions.set(op, fn);
      return `redis.register_function('${fn}', op_${op})`;
    });
    this.source = `#!lua name=${this.name}\n${helpers}\n${defs}\n${table}\n${BATCH_LUA}\n${registrations.join('\n')}\n`;
    for (const op of operations) {
      const fn = `local function op_${op.name}(KEYS, ARGV)\n${op.body}\nend`;
      this.#scripts.set(op.name, new LuaScript(op.name, `${helpers}\n${fn}\nreturn op_${op.name}(KEYS, ARGV)\n`));
    }
    this.#scripts.set(BATCH, new LuaScript(BATCH, `${helpers}\n${defs}\n${table}\n${BATCH_LUA}\nreturn op_batch(KEYS, ARGV)\n`));
  }

  /** The FCALL name of an operation (its name, or `batch`). */
  functionName(op: string): string {
    const fn = this.#functions.get(op);
    if (fn === undefined) throw new TypeError(`LuaLibrary ${this.name}: no operation ${op}`);
    return fn;
  }

  /** The script of an operation (the fallback where Functions are not used). */
  script(op: string): LuaScript {
    const script = this.#scripts.get(op);
    if (script === undefined) throw new TypeError(`LuaLibrary ${this.name}: no operation ${op}`);
    return script;
  }
}
