/**
 * A failed API call. `kind` is one of the API's error kinds ("not found",
 * "invalid argument", "permission denied", "unauthenticated", ...), `status`
 * the HTTP status (for a failure inside a stream whose 200 was already
 * sent: the status of its kind; undefined when the daemon could not be
 * reached).
 */
export class AmberError extends Error {
  readonly kind: string;
  readonly status: number | undefined;

  constructor(kind: string, message: string, status?: number, options?: { cause?: unknown }) {
    super(message, options);
    this.name = "AmberError";
    this.kind = kind;
    this.status = status;
  }

  override toString(): string {
    return `AmberError: ${this.message} (${this.kind}${this.status ? `, HTTP ${this.status}` : ""})`;
  }
}

/** Kinds the SDK itself produces, beside the daemon's. */
export const Kinds = {
  notFound: "not found",
  invalidArgument: "invalid argument",
  unavailable: "unavailable",
  internal: "internal",
} as const;
