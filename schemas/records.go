package schemas

// Version plumbing for every Record type. Kept in one place so that adding a
// type is one line here plus a validate method.
//
// Encode stamps only the record's own version. A nested TurnContext keeps the
// version it was built or decoded with: re-encoding a record must never turn
// an unsupported (or missing) context version into a supported one. Code
// that builds a TurnContext sets V itself (see pipeline/ingest).

func (m *InboundMessage) schemaVersion() uint16   { return m.V }
func (m *InboundMessage) currentVersion() uint16  { return InboundVersion }
func (m *InboundMessage) stampVersion()           { m.V = InboundVersion }
func (c *TurnContext) schemaVersion() uint16      { return c.V }
func (c *TurnContext) currentVersion() uint16     { return TurnContextVersion }
func (c *TurnContext) stampVersion()              { c.V = TurnContextVersion }
func (t *AcceptedTurn) schemaVersion() uint16     { return t.V }
func (t *AcceptedTurn) currentVersion() uint16    { return AcceptedTurnVersion }
func (t *AcceptedTurn) stampVersion()             { t.V = AcceptedTurnVersion }
func (d *Decision) schemaVersion() uint16         { return d.V }
func (d *Decision) currentVersion() uint16        { return DecisionVersion }
func (d *Decision) stampVersion()                 { d.V = DecisionVersion }
func (a *ApprovalRecord) schemaVersion() uint16   { return a.V }
func (a *ApprovalRecord) currentVersion() uint16  { return ApprovalVersion }
func (a *ApprovalRecord) stampVersion()           { a.V = ApprovalVersion }
func (e *DecidedEvent) schemaVersion() uint16     { return e.V }
func (e *DecidedEvent) currentVersion() uint16    { return DecidedEventVersion }
func (e *DecidedEvent) stampVersion()             { e.V = DecidedEventVersion }
func (r *DecisionRejected) schemaVersion() uint16 { return r.V }
func (r *DecisionRejected) currentVersion() uint16 {
	return DecisionRejectedVersion
}
func (r *DecisionRejected) stampVersion()        { r.V = DecisionRejectedVersion }
func (o *RedriveOutcome) schemaVersion() uint16  { return o.V }
func (o *RedriveOutcome) currentVersion() uint16 { return RedriveOutcomeVersion }
func (o *RedriveOutcome) stampVersion()          { o.V = RedriveOutcomeVersion }
func (o *TurnOutcome) schemaVersion() uint16     { return o.V }
func (o *TurnOutcome) currentVersion() uint16    { return TurnOutcomeVersion }
func (o *TurnOutcome) stampVersion()             { o.V = TurnOutcomeVersion }
func (b *BatchRecord) schemaVersion() uint16     { return b.V }
func (b *BatchRecord) currentVersion() uint16    { return BatchVersion }
func (b *BatchRecord) stampVersion()             { b.V = BatchVersion }
func (s *SessionRecord) schemaVersion() uint16   { return s.V }
func (s *SessionRecord) currentVersion() uint16  { return SessionVersion }
func (s *SessionRecord) stampVersion()           { s.V = SessionVersion }
func (c *ExecutionClaim) schemaVersion() uint16  { return c.V }
func (c *ExecutionClaim) currentVersion() uint16 { return ClaimVersion }
func (c *ExecutionClaim) stampVersion()          { c.V = ClaimVersion }

func (n *TurnNotice) schemaVersion() uint16  { return n.V }
func (n *TurnNotice) currentVersion() uint16 { return NoticeVersion }
func (n *TurnNotice) stampVersion()          { n.V = NoticeVersion }
