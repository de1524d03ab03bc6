/**
 * The verifier's only source of randomness for decisions that must replay: a seeded PRNG. The
 * same seed (with the same options) gives the same fault schedule, so a failing run can be
 * repeated with `--seed`. Run ids and owner secrets still come from crypto; they decide nothing.
 */

/** Largest accepted `--seed`: seeds are unsigned 32-bit integers. */
export const MAX_SEED = 0xffff_ffff;

/** mulberry32: a tiny 32-bit PRNG, good enough for schedules. Returns floats in [0, 1). */
export function mulberry32(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4_294_967_296;
  };
}

/** A 32-bit FNV-1a hash of a string, to derive one independent stream per nemesis from the seed. */
export function hash32(text: string): number {
  let h = 0x811c9dc5;
  for (let i = 0; i < text.length; i++) {
    h ^= text.charCodeAt(i);
    h = Math.imul(h, 0x01000193) >>> 0;
  }
  return h >>> 0;
}

/** A random seed for runs that were not given one (printed, so the run can be repeated). */
export function randomSeed(): number {
  return globalThis.crypto.getRandomValues(new Uint32Array(1))[0]!;
}

/** Uniform in [lo, hi). */
export function uniform(random: () => number, lo: number, hi: number): number {
  return lo + (hi - lo) * random();
}
