package discord

import (
	"context"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/tollgate-dev/tollgate/schemas"
)

// Discord channel types Tollgate tells apart.
const (
	chanGroupDM       = 3
	chanNewsThread    = 10
	chanPublicThread  = 11
	chanPrivateThread = 12
)

// permViewChannel is Discord's VIEW_CHANNEL permission bit.
const permViewChannel = 1 << 10

// lookupBudget bounds the channel reads of one request, so that a slow
// REST API leaves the rest of the answer's budget to the publish.
const lookupBudget = time.Second

// kindCache maps channels to channel kinds (see the package comment for
// the rule), caching what it read from the REST API.
type kindCache struct {
	api *rest
	log *slog.Logger
	mu  sync.Mutex
	m   map[string]schemas.ChannelKind
}

// kind is the kind of channel (of type channelType, -1 when unknown) in
// guild ("" for none).
func (c *kindCache) kind(ctx context.Context, guild, channel string, channelType int) (schemas.ChannelKind, error) {
	switch {
	case guild == "" && channelType == chanGroupDM:
		return schemas.ChannelPrivate, nil
	case guild == "":
		return schemas.ChannelDM, nil
	case channelType == chanPrivateThread:
		return schemas.ChannelPrivate, nil
	}
	c.mu.Lock()
	k, ok := c.m[channel]
	c.mu.Unlock()
	if ok {
		return k, nil
	}
	k, ok = c.lookup(ctx, guild, channel)
	if ok {
		c.mu.Lock()
		c.m[channel] = k
		c.mu.Unlock()
	}
	return k, nil
}

// lookup reads channel (and a public thread's parent) and tells whether
// @everyone is denied VIEW_CHANNEL there. A channel it cannot read is
// public (the widest audience, so nothing narrower is shown in it), and
// not cached (ok false): the next request reads it again.
func (c *kindCache) lookup(ctx context.Context, guild, channel string) (kind schemas.ChannelKind, ok bool) {
	ctx, cancel := context.WithTimeout(ctx, lookupBudget)
	defer cancel()
	ch, err := c.api.channel(ctx, channel)
	if err == nil && ch.Type == chanPrivateThread {
		return schemas.ChannelPrivate, true
	}
	if err == nil && (ch.Type == chanPublicThread || ch.Type == chanNewsThread) && ch.ParentID != "" {
		ch, err = c.api.channel(ctx, ch.ParentID)
	}
	if err != nil {
		c.log.Warn("discord: channel unreadable; counted as public", "channel", channel, "err", err)
		return schemas.ChannelPublic, false
	}
	for _, o := range ch.Overwrites {
		if o.ID != guild || o.Type != 0 {
			continue
		}
		if deny, err := strconv.ParseUint(o.Deny, 10, 64); err == nil && deny&permViewChannel != 0 {
			return schemas.ChannelPrivate, true
		}
	}
	return schemas.ChannelPublic, true
}
