package schemas

// Version plumbing for every Record type. Kept in one place so that adding a
// type is one line here plus a validate method.
//
// Encode stamps only the record's own version. A nested TurnContext keeps the
// version it was built or decoded with: re-encoding a record must never turn
// an unsupported (or missing) context version into a supported one. Code
// that builds a TurnContext sets V itself (see pipeline/ingest).

func (m *InboundMessage) schemaVersion() Version   { return m.V }
func (m *InboundMessage) currentVersion() Version  { return InboundVersion }
func (m *InboundMessage) stampVersion()            { m.V = InboundVersion }
func (c *TurnContext) schemaVersion() Version      { return c.V }
func (c *TurnContext) currentVersion() Version     { return TurnContextVersion }
func (c *TurnContext) stampVersion()               { c.V = TurnContextVersion }
func (t *AcceptedTurn) schemaVersion() Version     { return t.V }
func (t *AcceptedTurn) currentVersion() Version    { return AcceptedTurnVersion }
func (t *AcceptedTurn) stampVersion()              { t.V = AcceptedTurnVersion }
func (d *Decision) schemaVersion() Version         { return d.V }
func (d *Decision) currentVersion() Version        { return DecisionVersion }
func (d *Decision) stampVersion()                  { d.V = DecisionVersion }
func (a *ApprovalRecord) schemaVersion() Version   { return a.V }
func (a *ApprovalRecord) currentVersion() Version  { return ApprovalVersion }
func (a *ApprovalRecord) stampVersion()            { a.V = ApprovalVersion }
func (e *DecidedEvent) schemaVersion() Version     { return e.V }
func (e *DecidedEvent) currentVersion() Version    { return DecidedEventVersion }
func (e *DecidedEvent) stampVersion()              { e.V = DecidedEventVersion }
func (r *DecisionRejected) schemaVersion() Version { return r.V }
func (r *DecisionRejected) currentVersion() Version {
	return DecisionRejectedVersion
}
func (r *DecisionRejected) stampVersion()         { r.V = DecisionRejectedVersion }
func (o *RedriveOutcome) schemaVersion() Version  { return o.V }
func (o *RedriveOutcome) currentVersion() Version { return RedriveOutcomeVersion }
func (o *RedriveOutcome) stampVersion()           { o.V = RedriveOutcomeVersion }
func (o *TurnOutcome) schemaVersion() Version     { return o.V }
func (o *TurnOutcome) currentVersion() Version    { return TurnOutcomeVersion }
func (o *TurnOutcome) stampVersion()              { o.V = TurnOutcomeVersion }
func (b *BatchRecord) schemaVersion() Version     { return b.V }
func (b *BatchRecord) currentVersion() Version    { return BatchVersion }
func (b *BatchRecord) stampVersion() {
	b.V = BatchVersion
	if b.legacy {
		b.V = BatchLegacyVersion
	}
}
func (s *SessionRecord) schemaVersion() Version   { return s.V }
func (s *SessionRecord) currentVersion() Version  { return SessionVersion }
func (s *SessionRecord) stampVersion()            { s.V = SessionVersion }
func (c *ExecutionClaim) schemaVersion() Version  { return c.V }
func (c *ExecutionClaim) currentVersion() Version { return ClaimVersion }
func (c *ExecutionClaim) stampVersion()           { c.V = ClaimVersion }

func (n *TurnNotice) schemaVersion() Version  { return n.V }
func (n *TurnNotice) currentVersion() Version { return NoticeVersion }
func (n *TurnNotice) stampVersion()           { n.V = NoticeVersion }
