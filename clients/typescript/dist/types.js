// The answers of toolpool's API, as the OpenAPI document (GET /v1/openapi.json) describes them.
/** The final statuses: a call in one of them never changes again. */
export const TERMINAL = new Set(["ok", "error", "timeout", "denied", "cancelled", "expired", "lost"]);
