// Types of Tollgate's client. The wire types are generated from the
// gateway's OpenAPI document (openapi.d.ts, `npm run generate`); a test
// fails when they drift from transport/gateway/openapi.json.
import type { components } from "./openapi.js";

type S = components["schemas"];
export type Problem = S["Problem"];
export type Sender = S["Sender"];
export type Channel = S["Channel"];
export type ProposedCall = S["ProposedCall"];
export type SubmitRequest = S["SubmitRequest"];
export type SubmitResponse = S["SubmitResponse"];
export type Result = S["Result"];
export type DecisionInfo = S["DecisionInfo"];
export type Approval = S["Approval"];
export type Call = S["Call"];
export type Turn = S["Turn"];
export type ApprovalList = S["ApprovalList"];
export type DecisionRequest = S["DecisionRequest"];
export type DecisionResponse = S["DecisionResponse"];
export type { components, paths, operations } from "./openapi.js";

export declare const DEFAULT_URL: string;
/** The longest long poll the gateway serves, in ms. */
export declare const MAX_POLL_MS: number;
/** How far webhook-timestamp may be from now, in seconds. */
export declare const WEBHOOK_TOLERANCE_SEC: number;

/**
 * One Server-Sent Event: `id` its id, `type` its kind, `data` its record.
 *
 * `id` is an opaque cursor string (dot-separated decimals such as `"42.7.0.13.2"`;
 * a gateway of an earlier version sends a bare decimal such as `"42"`): keep the last
 * one seen verbatim and pass it back as `lastEventId` to resume. Do not parse it,
 * order events by it or compute with it.
 *
 * `batch.awaiting` and `redrive.started` are sent only for turns of earlier versions: a turn of
 * this version waits and starts in its turn's log, which the event streams do not carry. An
 * `approval.requested` event tells a UI that a turn waits; `wait(id)` (a long poll of
 * `GET /v1/turns/{id}`), `turn(id)` or the `turn.outcome` event that it moved on.
 */
export interface TollgateEvent {
  /** Opaque cursor: send it back as is (`lastEventId`) to resume after this event. */
  id: string;
  type: "approval.requested" | "approval.decided" | "approval.voted" | "redrive.deferred" | "redrive.failed" | "turn.outcome"
    /** Earlier versions' turns only (see above). */
    | "batch.awaiting" | "redrive.started" | (string & {});
  data: Record<string, unknown>;
}

/** A sender or decider: an id, or a Sender object. */
export type Who = string | Sender;
/** A call to submit: `[tool, args]` or a ProposedCall. */
export type CallSpec = [tool: string, args: Record<string, unknown>] | ProposedCall;

export interface ClientOptions {
  /** Default `$TOLLGATE_URL`, else http://127.0.0.1:8080. */
  url?: string;
  /** Default `$TOLLGATE_KEY` (Node). */
  key?: string;
  /** Default session of submit and gated. */
  sessionId?: string;
  /** Default sender of submit and gated. */
  sender?: Who;
  /** Retries of a 429 RATE_LIMITED answer after its Retry-After (default 3). */
  retries?: number;
  /** Timeout of one request, ms (default 30000; long polls add their wait). */
  timeoutMs?: number;
  /** The fetch to use (default globalThis.fetch). */
  fetch?: typeof fetch;
}

export interface SubmitOptions {
  sessionId?: string;
  sender?: Who;
  text?: string;
  channel?: Channel;
  /** The same key again returns the same turn (`duplicate: true`). */
  idempotencyKey?: string;
}

export interface GateOptions extends SubmitOptions {
  /** Called with the submit's answer before the wait: e.g. to show the pending approval. */
  onSubmitted?: (sub: SubmitResponse) => void;
  /** How long to wait for the outcome, ms (default one hour); then DecisionPending. */
  timeoutMs?: number;
  signal?: AbortSignal;
}

export interface DecideOptions {
  /** Required when deciding by id: the digest of the arguments the decider saw. */
  argsDigest?: string;
  note?: string;
  channel?: Channel;
  idempotencyKey?: string;
}

export interface StreamOptions {
  /**
   * Resume after this event: the `id` of the last event seen (an opaque cursor
   * string, sent as `Last-Event-ID` exactly as given).
   */
  lastEventId?: string;
  signal?: AbortSignal;
}

/** A gated function: its arguments object goes through Tollgate first. */
export interface Gated<A extends Record<string, unknown>, R> {
  (args: A): Promise<R>;
  readonly tollgateTool: string;
}

export interface ApprovalsOptions {
  status?: "pending" | "approved" | "denied" | "expired" | "abandoned" | "all";
  session?: string;
}

export declare class Client {
  constructor(opts?: ClientOptions);
  readonly url: string;
  /** POST /v1/turns. */
  submit(calls?: CallSpec[] | null, opts?: SubmitOptions): Promise<SubmitResponse>;
  /** GET /v1/turns/{id}. */
  turn(turnId: string): Promise<Turn>;
  /** Long-polls until the turn is terminal or timeoutMs (default 60 s) passed; returns it as it is then. */
  wait(turnId: string, opts?: { timeoutMs?: number; signal?: AbortSignal }): Promise<Turn>;
  /** A turn's events from its first (or after lastEventId), ending after its turn.outcome; a dropped connection is resumed with Last-Event-ID. */
  events(turnId: string, opts?: StreamOptions): AsyncGenerator<TollgateEvent, void, undefined>;
  /** New events of a session's turns (or those after lastEventId), resumed like events; never ends by itself. */
  sessionEvents(sessionId: string, opts?: StreamOptions): AsyncGenerator<TollgateEvent, void, undefined>;
  /** GET /v1/approvals (status default pending): every page, oldest request first. */
  approvals(opts?: ApprovalsOptions): Promise<Approval[]>;
  /** GET /v1/approvals page by page (limit a page, default 200), following next_cursor: each approval once. */
  iterApprovals(opts?: ApprovalsOptions & { limit?: number }): AsyncGenerator<Approval, void, undefined>;
  /** One page of GET /v1/approvals: limit (1-200, the gateway's default 50) after cursor (the previous page's next_cursor, same status and session); a bad cursor rejects CURSOR_INVALID. */
  approvalsPage(opts?: ApprovalsOptions & { limit?: number; cursor?: string }): Promise<ApprovalList>;
  /** GET /v1/approvals/{id}. */
  approval(approvalId: string): Promise<Approval>;
  /** POST /v1/approvals/{id}/decisions with the digest of `approval` (an Approval or a pending Call) or opts.argsDigest. */
  decide(approval: Approval | Call | string, option: string, decider: Who, opts?: DecideOptions): Promise<DecisionResponse>;
  approve(approval: Approval | Call | string, decider: Who, opts?: DecideOptions): Promise<DecisionResponse>;
  deny(approval: Approval | Call | string, decider: Who, opts?: DecideOptions): Promise<DecisionResponse>;
  /** Sends one call and resolves with it on the approved outcome (result ok); rejects with NotApproved (the result's code) or DecisionPending. */
  gate(tool: string, args: Record<string, unknown>, opts?: GateOptions): Promise<Call>;
  /** `fn` runs only on the approved outcome of its call of `tool`, with the arguments as approved. */
  gated<A extends Record<string, unknown>, R>(tool: string, fn: (args: A, call: Call) => R | Promise<R>, opts?: GateOptions): Gated<A, Awaited<R>>;
}

export declare class TollgateError extends Error {
  constructor(code: string, message?: string);
  /** Tollgate's reason code. */
  readonly code: string;
}
export declare class APIError extends TollgateError {
  readonly status: number;
  readonly title: string;
  readonly detail: string;
  readonly problem: Problem | Record<string, never>;
  /** Seconds of a Retry-After header (429). */
  readonly retryAfter?: number;
}
export declare class UnavailableError extends TollgateError {}
export declare class NotApproved extends TollgateError {
  readonly call: Call;
  readonly turnId: string;
}
export declare class DecisionPending extends TollgateError {
  readonly turnId: string;
  readonly approvalId: string;
}
export declare class WebhookVerificationError extends TollgateError {}

/** Verifies a webhook request (Standard Webhooks) and returns its decoded body; throws WebhookVerificationError. */
export declare function verifyWebhook(
  secret: string,
  headers: Headers | Record<string, string | string[] | undefined>,
  body: string | Uint8Array | ArrayBuffer,
  opts?: { toleranceSec?: number; now?: number },
): Promise<{ type: string; timestamp: string; data: Record<string, unknown> }>;
