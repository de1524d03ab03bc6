export { httpBackend } from './backend.js';
export { HTTP_DEFAULTS, type HttpBackendOptions } from './options.js';
