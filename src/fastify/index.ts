/**
 * leasehold/fastify: a fastify plugin honouring the `Idempotency-Key` request header
 * (draft-ietf-httpapi-idempotency-key-header) on leasehold's idempotency: the first request runs
 * the route, a repeat replays its stored response, a concurrent one gets 409 and another request
 * under the same key 422. fastify is an optional peer dependency; this entry point loads none of
 * its code (the plugin is a function with fastify-plugin's markers).
 */
export {
  fastifyIdempotency,
  FASTIFY_IDEMPOTENCY_DEFAULTS,
  type FastifyIdempotencyOptions,
  type IdempotencyRouteConfig,
  type IdempotencyRunner,
} from './plugin.js';
export { parseIdempotencyKey, MAX_IDEMPOTENCY_KEY_LENGTH, type ParsedKey } from './header.js';
