package discord

import (
	"context"
	"strconv"
	"sync"

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

// kindCache maps channels to channel kinds (see the package comment for
// the rule), caching what it read from the REST API.
type kindCache struct {
	api *rest
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
	k = c.lookup(ctx, guild, channel)
	c.mu.Lock()
	c.m[channel] = k
	c.mu.Unlock()
	return k, nil
}

// lookup reads channel (and a public thread's parent) and tells whether
// @everyone is denied VIEW_CHANNEL there. A channel it cannot read is
// public: the widest audience, so nothing narrower is shown in it.
func (c *kindCache) lookup(ctx context.Context, guild, channel string) schemas.ChannelKind {
	ch, err := c.api.channel(ctx, channel)
	if err == nil && ch.Type == chanPrivateThread {
		return schemas.ChannelPrivate
	}
	if err == nil && (ch.Type == chanPublicThread || ch.Type == chanNewsThread) && ch.ParentID != "" {
		ch, err = c.api.channel(ctx, ch.ParentID)
	}
	if err != nil {
		c.api.log.Warn("discord: channel unreadable; counted as public", "channel", channel, "err", err)
		return schemas.ChannelPublic
	}
	for _, o := range ch.Overwrites {
		if o.ID != guild || o.Type != 0 {
			continue
		}
		if deny, err := strconv.ParseUint(o.Deny, 10, 64); err == nil && deny&permViewChannel != 0 {
			return schemas.ChannelPrivate
		}
	}
	return schemas.ChannelPublic
}
