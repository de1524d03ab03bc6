#!/usr/bin/env node
/**
 * The `leasehold` command:
 *
 * - `leasehold run KEY [--ttl 30s] [--wait 0] [--limit N] [--min-hold D] [--label TEXT] [--url URL] [--grace 10s] [--mode M] -- COMMAND ARGS…`
 * - `leasehold ls [PREFIX] [--url URL] [--json]`
 * - `leasehold demo [--ttl 1s] [--pause 1.2s] [--dir DIR] [--url URL] [--dashboard] [--port 7071]`
 * - `leasehold dashboard [--url URL] [--prefix P] [--host 127.0.0.1] [--port 7071]`
 * - `leasehold verify --url URL [--fence KIND] [--workers 3] [--duration 30s] [--ttl 1s] [--seed S] [--nemesis LIST] [--no-fence] [--limit N [--count-then-acquire]] [--report DIR]`
 *
 * Every expected failure is one line on stderr (`leasehold: …`) and an exit code from
 * {@link EXIT}; bad arguments add a `usage:` line and exit 64. Set LEASEHOLD_DEBUG=1 to see the
 * stack of an internal error.
 */
import { once } from 'node:events';
import { readFileSync } from 'node:fs';
import { Command, type CommanderError, InvalidArgumentError as CommanderArgumentError, Option } from 'commander';
import { InvalidArgumentError } from '../core/errors.js';
import { checkLabel, MAX_LIMIT } from '../core/options.js';
import { checkKey, MIN_TTL_MS, type LockMode } from '../core/validate.js';
import { formatDuration, parseDuration } from '../util/duration.js';
import { sleep } from '../util/sleep.js';
import { defaultWorkers, MAX_SEED, NEMESES, STORE_KINDS, VERIFY_LIMITS, type NemesisKind, type StoreKind } from '../verify/index.js';
import { runDashboardCommand } from './dashboard.js';
import { runDemo } from './demo.js';
import { CliExit, EXIT, oneLine, toCliExit, usageError } from './exit.js';
import { listLeases } from './ls.js';
import { runCommand } from './run.js';
import { addServeCommand } from './serve.js';
import { verifyCommand } from './verify.js';

const USAGE = Object.freeze({
  program: 'leasehold <run|ls|demo|verify|dashboard|serve> [options]   (leasehold --help)',
  run: 'leasehold run KEY [--ttl 30s] [--wait 0] [--limit N] [--min-hold D] [--label TEXT] [--url URL] [--grace 10s] [--mode exclusive|shared] -- COMMAND [ARGS...]',
  ls: 'leasehold ls [PREFIX] [--url URL] [--json]',
  demo: 'leasehold demo [--ttl 1s] [--pause 1.2s] [--dir DIR] [--url URL] [--dashboard] [--host 127.0.0.1] [--port 7071]',
  dashboard: 'leasehold dashboard [--url URL] [--prefix P] [--host 127.0.0.1] [--port 7071]',
  verify:
    'leasehold verify --url URL [--fence sqlite|postgres|mysql|redis] [--fence-url URL] [--workers 3] [--duration 30s] [--ttl 1s] [--work DURATION] [--seed S] [--nemesis pause,delay,crash,clock] [--no-fence] [--limit N [--count-then-acquire]] [--report DIR]',
});

/** Thrown by commander's exit hook instead of exiting: what it would have exited with, and for which command. */
class CommanderExit extends Error {
  constructor(
    readonly error: CommanderError,
    readonly usage: string,
  ) {
    super(error.message);
  }
}

function packageVersion(): string {
  try {
    const pkg = JSON.parse(readFileSync(new URL('../../package.json', import.meta.url), 'utf8')) as { version?: unknown };
    return typeof pkg.version === 'string' ? pkg.version : 'unknown';
  } catch {
    return 'unknown';
  }
}

/** A commander option parser for durations: a bad value becomes commander's own invalid-argument error. */
function durationOption(flag: string, allowForever = false): (value: string) => number {
  return (value) => {
    try {
      return parseDuration(value, flag, { allowForever });
    } catch (error) {
      if (error instanceof InvalidArgumentError) throw new CommanderArgumentError(error.message.replace(`invalid ${flag}: `, ''));
      throw error;
    }
  };
}

/**
 * Builds the program. `commandLine` is what followed `--` after `run` (undefined when there was
 * no `--`); `done` receives the exit code of the subcommand that ran.
 */
function buildProgram(commandLine: string[] | undefined, done: (code: number) => void): Command {
  const program = new Command('leasehold');
  const guard = (cmd: Command, usage: string): Command =>
    cmd.configureOutput({ outputError: (text, write) => write(`leasehold: ${text}`) }).exitOverride((error) => {
      throw new CommanderExit(error, usage);
    });
  /** Runs a subcommand; its errors become one-line exits carrying the subcommand's usage. */
  const action =
    <A extends unknown[]>(usage: string, fn: (...args: A) => Promise<number>) =>
    async (...args: A): Promise<void> => {
      try {
        done(await fn(...args));
      } catch (error) {
        throw toCliExit(error, usage);
      }
    };

  guard(program, USAGE.program)
    .description('Distributed leases with fencing tokens.')
    .usage('<command> [options]')
    .version(packageVersion(), '-V, --version', 'print the version')
    .helpOption('-h, --help', 'show help')
    .showSuggestionAfterError()
    .addHelpText(
      'after',
      "\nExit codes: 0 ok (run: COMMAND's own code), 64 bad arguments, 69 coordinator unavailable,\n75 key busy, 126 cannot execute, 127 command not found, 128+n killed by signal n.",
    );

  const run = guard(program.command('run'), USAGE.run)
    .summary('run COMMAND while holding the lease on KEY')
    .description(
      'Runs COMMAND (no shell) while holding the lease on KEY, renewed in the background, and releases it when COMMAND exits. ' +
        'COMMAND gets LEASEHOLD_KEY, LEASEHOLD_TOKEN and LEASEHOLD_SEQUENCER. When the lease is lost it gets SIGTERM, then SIGKILL after --grace. ' +
        'SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1 and SIGUSR2 are forwarded to it.\n\n' +
        'With --limit N the lease is one permit of a semaphore: at most N instances run at once, each with its own token ' +
        '(every instance must name the same N). With --min-hold D the key stays held until D after the grant even if COMMAND ends sooner, ' +
        'so a machine whose cron fires a little later skips (with D longer than --ttl, leasehold stays until one ttl of the hold is left).\n\n' +
        "Exits with COMMAND's code (128+n if a signal killed it), 75 when KEY is busy, 69 when the coordinator is unreachable, " +
        '127 when COMMAND is not found, 64 for bad arguments.',
    )
    .usage('KEY [options] -- COMMAND [ARGS...]')
    .argument('<KEY>', 'the lease key, e.g. nightly-report')
    .allowExcessArguments(true)
    .addOption(new Option('--ttl <duration>', 'lease ttl: how long a crashed holder keeps the key').default(30_000, '30s').argParser(durationOption('--ttl')))
    .addOption(
      new Option('--wait <duration>', 'how long to wait for a busy key (0: skip at once; forever)').default(0, '0').argParser(durationOption('--wait', true)),
    )
    .addOption(new Option('--url <url>', 'coordinator URL: sqlite:PATH, memory:, ... (default: $LEASEHOLD_URL, else sqlite:./leasehold.db)'))
    .addOption(new Option('--grace <duration>', 'after a lost lease, time from SIGTERM to SIGKILL').default(10_000, '10s').argParser(durationOption('--grace')))
    .addOption(new Option('--mode <mode>', 'exclusive (one holder) or shared (many)').choices(['exclusive', 'shared']).default('exclusive'))
    .addOption(
      new Option('--limit <n>', `a semaphore permit: at most N holders of KEY at once, 1…${MAX_LIMIT} (Consul's lock -n)`).argParser(
        integerOption(1, MAX_LIMIT),
      ),
    )
    .addOption(
      new Option('--min-hold <duration>', 'keep KEY held this long after the grant even if COMMAND ends sooner').argParser(durationOption('--min-hold')),
    )
    .addOption(new Option('--label <text>', "the grant's public label, shown by ls and the dashboard (default: the holder name)"));
  run.action(
    action(
      USAGE.run,
      async (
        key: string,
        opts: { ttl: number; wait: number; url?: string; grace: number; mode: LockMode; limit?: number; minHold?: number; label?: string },
        cmd: Command,
      ) => {
        if (cmd.args.length > 1) throw usageError(`COMMAND goes after --, as in: leasehold run ${key} -- ${cmd.args.slice(1).join(' ')}`, USAGE.run);
        if (commandLine === undefined || commandLine.length === 0) throw usageError('missing COMMAND after --', USAGE.run);
        const [command, ...args] = commandLine as [string, ...string[]];
        if (command.length === 0) throw usageError('COMMAND must not be empty', USAGE.run);
        checkKey(key, 'KEY');
        if (opts.ttl < MIN_TTL_MS) throw usageError(`--ttl must be at least ${MIN_TTL_MS}ms, got ${formatDuration(opts.ttl)}`, USAGE.run);
        // Checked here rather than by commander, whose message would quote a label with a newline over two lines.
        if (opts.label !== undefined) checkLabel(opts.label, '--label');
        // A permit is shared with its limit: an explicit --mode beside --limit is either redundant or a contradiction.
        if (opts.limit !== undefined && cmd.getOptionValueSource('mode') === 'cli')
          throw usageError('--limit and --mode do not go together: a permit of a semaphore is its own mode (leave --mode out)', USAGE.run);
        return runCommand(
          {
            key,
            command,
            args,
            ttlMs: opts.ttl,
            waitMs: opts.wait,
            graceMs: opts.grace,
            mode: opts.mode,
            url: opts.url,
            limit: opts.limit,
            minHoldMs: opts.minHold ?? 0,
            label: opts.label,
          },
          (line) => process.stderr.write(`leasehold: ${line}\n`),
        );
      },
    ),
  );

  guard(program.command('ls'), USAGE.ls)
    .summary('list current holders, tokens, expiry and waiters')
    .description(
      "Lists the holders of keys starting with PREFIX (all keys by default): KEY, MODE, LIMIT (a semaphore's, - for a plain lock), TOKEN, HOLDER (the grant's label), EXPIRES IN, WAITERS, LOCK-DELAY.",
    )
    .argument('[PREFIX]', 'only keys starting with this')
    .addOption(new Option('--url <url>', 'coordinator URL: sqlite:PATH, memory:, ... (default: $LEASEHOLD_URL, else sqlite:./leasehold.db)'))
    .option('--json', 'print JSON (tokens as strings)')
    .action(
      action(USAGE.ls, async (prefix: string | undefined, opts: { url?: string; json?: boolean }) =>
        listLeases({ prefix, url: opts.url, json: opts.json === true }, (text) => process.stdout.write(text)),
      ),
    );

  guard(program.command('demo'), USAGE.demo)
    .summary('the zombie-worker scenario with real processes and SIGSTOP, without and with a fence')
    .description(
      'Worker A (a real process) takes a lease, checks it, and is frozen with SIGSTOP for --pause, longer than --ttl, before it saves. ' +
        'Worker B takes over with a higher token and saves. Run 1 saves with plain UPDATEs: A overwrites B. ' +
        'Run 2 saves through sqliteFence: A is refused with StaleTokenError.\n\n' +
        "Exits 0 when the fence kept B's result, 1 when it did not.",
    )
    .addOption(new Option('--ttl <duration>', 'lease ttl of both workers').default(1_000, '1s').argParser(durationOption('--ttl')))
    .addOption(
      new Option('--pause <duration>', 'how long worker A stays frozen (must exceed --ttl)').default(1_200, '1.2s').argParser(durationOption('--pause')),
    )
    .option('--dir <dir>', 'keep the lease and data files in DIR (default: a temporary directory, removed afterwards)')
    .addOption(
      new Option(
        '--url <url>',
        'the coordinator the workers lease from: sqlite:PATH, redis://…, postgres://…, mysql://…, etcd://…, http(s)://… (default: a SQLite file in the demo directory; the document and its fence stay in SQLite)',
      ),
    )
    .option(
      '--dashboard',
      'serve the live dashboard of the lease store: the demo starts when a page connects (or after 30 s) and the page stays up after it, until Ctrl-C',
    )
    .addOption(new Option('--host <host>', "the dashboard's address (with --dashboard)").default('127.0.0.1'))
    .addOption(new Option('--port <port>', "the dashboard's port, 0 for any free one (with --dashboard)").default(7071).argParser(integerOption(0, 65_535)))
    .action(
      action(USAGE.demo, async (opts: { ttl: number; pause: number; dir?: string; url?: string; dashboard?: boolean; host: string; port: number }) =>
        runDemo(
          {
            ttlMs: opts.ttl,
            pauseMs: opts.pause,
            dir: opts.dir,
            url: opts.url,
            dashboard: opts.dashboard ? { host: opts.host, port: opts.port, waitForViewerMs: 30_000 } : undefined,
          },
          process.stdout,
          USAGE.demo,
        ),
      ),
    );

  guard(program.command('dashboard'), USAGE.dashboard)
    .summary('serve a live page of holders, tokens, waiters and changes')
    .description(
      'Serves a web page (on loopback by default) that shows, live, every key under --prefix on the coordinator at --url: mode, holders ' +
        'with their labels and tokens, time left, waiters, lock-delay, the last token, and a timeline of grants, releases, expiries and ' +
        'take-overs. It reads the coordinator every 250 ms and pushes changes to the page (Server-Sent Events). Nothing secret is shown.\n\n' +
        'Runs until SIGINT or SIGTERM (exit 0); exits 69 when the coordinator cannot be reached or the port cannot be used, 64 for bad arguments.',
    )
    .addOption(new Option('--url <url>', 'coordinator URL: sqlite:PATH, memory:, ... (default: $LEASEHOLD_URL, else sqlite:./leasehold.db)'))
    .addOption(new Option('--prefix <prefix>', 'only keys starting with this').default(''))
    .addOption(
      new Option('--host <host>', 'the address to listen on (the page shows who holds what: keep it on loopback unless you mean it)').default('127.0.0.1'),
    )
    .addOption(new Option('--port <port>', 'the port, 0 for any free one').default(7071).argParser(integerOption(0, 65_535)))
    .action(
      action(USAGE.dashboard, async (opts: { url?: string; prefix: string; host: string; port: number }) =>
        runDashboardCommand({ url: opts.url, prefix: opts.prefix, host: opts.host, port: opts.port }, (line) => process.stdout.write(`${line}\n`)),
      ),
    );

  // `--fence KIND` and `--no-fence` set the same option (the last one would silently win): both given is a usage error.
  const fenceFlags = new Set<string>();
  const verify = guard(program.command('verify'), USAGE.verify);
  verify.on('option:fence', () => fenceFlags.add('--fence'));
  verify.on('option:no-fence', () => fenceFlags.add('--no-fence'));
  verify
    .summary('check leases and fences under faults: real workers, pauses, delays, crashes, skewed clocks')
    .description(
      'Runs --workers real processes that loop acquire -> work -> write -> release on one key of the coordinator at --url, ' +
        'each write a read-modify-write of a counter plus a log row, through the fence. Meanwhile the nemesis freezes lease holders ' +
        '(pause: SIGSTOP past the ttl), holds their requests in a TCP proxy past their lease (delay), kills and restarts the coordinator ' +
        '(crash: only one verify started, --url local:redis|local:postgres|local:etcd|local:redlock) and skews their clocks (clock), on a schedule ' +
        'fixed by --seed. Then it checks the history: tokens unique and increasing, accepted tokens never decrease, no lost update, ' +
        'loss signalled in time (I6). --no-fence is the control run: it must fail.\n\n' +
        "Without --limit the workers take an exclusive lock, which is also the election case: a leader's term is its lease and the token its term, " +
        "so a run without --limit already checks leaders' terms: no two valid at once (I6), and every fenced write of a deposed leader refused (I3).\n\n" +
        'With --limit N the workers hold permits of a semaphore of N (default --workers: 2N + 2, at most 64) and the history must show at most N ' +
        'valid permits at any moment (a permit is valid from its grant until its release, its loss signal or its local validity deadline, ' +
        'whichever comes first). The fence still orders every write by token: a late write (sent after its own permit ended) must be refused, ' +
        'or have committed before any higher token (harmless); valid permits refused because a newer permit wrote first are counted, not faulted. ' +
        '--count-then-acquire is its control run: the workers build the semaphore themselves (count the holders with inspect, then take a plain ' +
        'shared lock when fewer than N); with the default workers it fails the permits check.\n\n' +
        'Exits 0 when every check passed, 1 when one failed, 69 when the coordinator or the store cannot be reached, 64 for bad arguments.',
    )
    .addOption(
      new Option(
        '--url <url>',
        'the coordinator: sqlite:PATH, redis://…, postgres://…, mysql://…, etcd://…, redlock://…, http(s)://… (a leasehold serve), or local:redis|local:postgres|local:etcd|local:redlock|local:sqlite (started by verify)',
      ),
    )
    .addOption(
      new Option('--fence <kind>', "where the protected resource lives (default: the coordinator's kind when it has a fence, else sqlite)").choices([
        ...STORE_KINDS,
      ]),
    )
    .addOption(new Option('--no-fence', 'the control run: write without a token check (must fail)'))
    .addOption(
      new Option('--fence-url <url>', "the server of the resource for --fence postgres|mysql|redis (default: the coordinator's URL when it is of that kind)"),
    )
    .addOption(
      new Option('--workers <n>', 'worker processes (with --limit N: 2N + 2, at most 64)').default(3).argParser(integerOption(1, VERIFY_LIMITS.maxWorkers)),
    )
    .addOption(new Option('--duration <duration>', 'how long the workload runs').default(30_000, '30s').argParser(durationOption('--duration')))
    .addOption(new Option('--ttl <duration>', 'lease ttl (the coordinator may round it up)').default(1_000, '1s').argParser(durationOption('--ttl')))
    .addOption(new Option('--work <duration>', 'time in the critical section before each write (default: ttl/5)').argParser(durationOption('--work')))
    .addOption(new Option('--seed <n>', `seed of the fault schedule, 0…${MAX_SEED} (default: random, printed)`).argParser(integerOption(0, MAX_SEED)))
    .addOption(new Option('--nemesis <list>', `faults to inject, comma-separated, or none`).default([...NEMESES], NEMESES.join(',')).argParser(nemesisOption))
    .addOption(
      new Option('--limit <n>', `the workers hold permits of a semaphore of N (1…${MAX_LIMIT}) instead of an exclusive lock`).argParser(
        integerOption(1, MAX_LIMIT),
      ),
    )
    .option('--count-then-acquire', 'the control run of --limit: a semaphore the workers build from inspect and a shared lock (must fail)')
    .option('--report <dir>', 'write history.jsonl and timeline.svg into DIR')
    .action(
      action(
        USAGE.verify,
        async (opts: {
          url?: string;
          fence?: StoreKind | false;
          fenceUrl?: string;
          workers: number;
          duration: number;
          ttl: number;
          work?: number;
          seed?: number;
          nemesis: NemesisKind[];
          report?: string;
          limit?: number;
          countThenAcquire?: boolean;
        }) => {
          const url = opts.url ?? (process.env.LEASEHOLD_URL || undefined);
          if (url === undefined)
            throw usageError(
              '--url is required (or set LEASEHOLD_URL): the coordinator to verify, e.g. --url local:redis or --url sqlite:./locks.db',
              USAGE.verify,
            );
          if (fenceFlags.size > 1) throw usageError('--no-fence and --fence do not go together: the control run writes without any fence', USAGE.verify);
          if (opts.fence === false && opts.fenceUrl !== undefined) throw usageError('--no-fence and --fence-url do not go together', USAGE.verify);
          return verifyCommand(
            {
              url,
              fence: opts.fence === false ? undefined : opts.fence,
              fenceUrl: opts.fenceUrl,
              workers: verify.getOptionValueSource('workers') === 'cli' ? opts.workers : defaultWorkers(opts.limit),
              durationMs: opts.duration,
              ttlMs: opts.ttl,
              workMs: opts.work,
              seed: opts.seed,
              nemeses: opts.nemesis,
              fenced: opts.fence !== false,
              reportDir: opts.report,
              limit: opts.limit,
              countThenAcquire: opts.countThenAcquire === true,
            },
            process.stdout,
            USAGE.verify,
          );
        },
      ),
    );

  addServeCommand(program, guard, action);

  return program;
}

/** A commander option parser for an integer in [min, max]. */
function integerOption(min: number, max: number): (value: string) => number {
  return (value) => {
    if (!/^\d+$/.test(value) || Number(value) < min || Number(value) > max)
      throw new CommanderArgumentError(`expected an integer from ${min} to ${max}, got ${JSON.stringify(value)}`);
    return Number(value);
  };
}

/** `--nemesis pause,clock` (or `none`): a list of known nemesis names. */
function nemesisOption(value: string): NemesisKind[] {
  if (value.trim().toLowerCase() === 'none') return [];
  const names = value
    .split(',')
    .map((s) => s.trim().toLowerCase())
    .filter((s) => s.length > 0);
  const unknown = names.filter((n) => !(NEMESES as readonly string[]).includes(n));
  if (names.length === 0 || unknown.length > 0)
    throw new CommanderArgumentError(`expected a comma-separated list of ${NEMESES.join(', ')} (or none), got ${JSON.stringify(value)}`);
  return [...new Set(names)] as NemesisKind[];
}

/** Parses `argv` (without node and script), runs the subcommand, and resolves with the exit code. */
export async function main(argv: readonly string[]): Promise<number> {
  // `run` takes everything after the first `--` as COMMAND, untouched: options of COMMAND are never ours.
  let commandLine: string[] | undefined;
  let ours = [...argv];
  if (argv[0] === 'run') {
    const dashes = argv.indexOf('--');
    if (dashes >= 0) {
      commandLine = argv.slice(dashes + 1);
      ours = argv.slice(0, dashes);
    }
  }
  let code: number = EXIT.OK;
  try {
    await buildProgram(commandLine, (c) => {
      code = c;
    }).parseAsync(ours, { from: 'user' });
    return code;
  } catch (error) {
    if (error instanceof CommanderExit) {
      const { code: id } = error.error;
      if (id === 'commander.helpDisplayed' || id === 'commander.version') return EXIT.OK;
      // Commander has printed its one-line error (or, for a missing subcommand, the help) already.
      process.stderr.write(`usage: ${error.usage}\n`);
      return EXIT.USAGE;
    }
    const exit = error instanceof CliExit ? error : toCliExit(error, USAGE.program);
    if (exit.exitCode === EXIT.SOFTWARE && process.env.LEASEHOLD_DEBUG) console.error(error);
    process.stderr.write(`leasehold: ${oneLine(exit.message)}\n`);
    if (exit.usage) process.stderr.write(`usage: ${exit.usage}\n`);
    return exit.exitCode;
  }
}

async function exit(code: number): Promise<never> {
  // Let a large `ls --json` reach a slow pipe, but never hang on a reader that is gone.
  if (process.stdout.writableNeedDrain && !process.stdout.destroyed) {
    await Promise.race([once(process.stdout, 'drain').catch(() => {}), sleep(5_000, { ref: false })]);
  }
  process.exit(code);
}

// A reader that went away (`leasehold demo | head`) is not an error worth a stack trace, and the
// command must still finish its cleanup (kill workers, release leases, remove temp files).
for (const stream of [process.stdout, process.stderr]) {
  stream.on('error', (error: NodeJS.ErrnoException) => {
    if (error.code === 'EPIPE') return;
    // Output itself failed (a full disk behind a redirect, a closed terminal): nothing sensible
    // can be printed any more; end with the internal-error code instead of a stack trace.
    process.exitCode = EXIT.SOFTWARE;
  });
}

// Last line of defence: never a stack trace or an unhandled rejection for the user.
process.on('unhandledRejection', (reason) => {
  process.stderr.write(`leasehold: internal error: ${oneLine(reason instanceof Error ? reason.message : String(reason))}\n`);
  if (process.env.LEASEHOLD_DEBUG) console.error(reason);
  process.exit(EXIT.SOFTWARE);
});

main(process.argv.slice(2)).then(exit, (error: unknown) => {
  process.stderr.write(`leasehold: internal error: ${oneLine(error instanceof Error ? error.message : String(error))}\n`);
  process.exit(EXIT.SOFTWARE);
});
