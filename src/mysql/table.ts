import { mapMysqlError, type MysqlPool } from './util.js';

/** Whether the table exists in the connection's database (information_schema lists only what the user may see). */
const EXISTS = 'SELECT 1 FROM information_schema.tables WHERE table_schema = DATABASE() AND table_name = ?';

/**
 * Creates a store's table on first use when it is missing: looks first, so a user granted only
 * SELECT, INSERT, UPDATE and DELETE on a table an administrator created never runs the CREATE
 * (MySQL checks the CREATE privilege before IF NOT EXISTS). Many processes creating it at once are
 * serialised by the server's metadata lock. Returns the once-per-store check: a failure is
 * BackendUnavailableError naming `what`, and the next call tries again.
 */
export function tableOnFirstUse(pool: MysqlPool, name: string, create: string, what: string): () => Promise<void> {
  let ready: Promise<void> | undefined;
  const make = async (): Promise<void> => {
    const [rows] = await pool.query(EXISTS, [name]);
    if ((rows as unknown[]).length === 0) await pool.query(create);
  };
  return () =>
    (ready ??= make().catch((error: unknown) => {
      ready = undefined;
      throw mapMysqlError(what, error);
    }));
}
