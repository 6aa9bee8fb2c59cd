package executor

import (
	"context"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/micro"

	"github.com/tollgate-dev/tollgate/jetstream/topology"
	"github.com/tollgate-dev/tollgate/policy"
	"github.com/tollgate-dev/tollgate/schemas"
)

// ToolsService is the name of the NATS service (nats.go micro) under which
// each executor answers topology.SubjectToolsList, in the service's queue
// group: one executor answers each request.
const ToolsService = "tollgate-tools"

// ListTools returns the tool list the executor serves. A provider that
// cannot list its tools is named in Errors; the others are listed.
func (x *Executor) ListTools(ctx context.Context) schemas.ToolList {
	specs, err := x.cfg.Engine.Tools().List(ctx)
	l := schemas.ToolList{PolicyVersion: x.cfg.Policy.Version(), Tools: make([]schemas.ToolInfo, 0, len(specs))}
	if err != nil {
		l.Errors = []string{err.Error()}
	}
	for _, s := range specs {
		info := schemas.ToolInfo{ToolSpec: s, Modes: make(map[schemas.Audience]policy.Mode, len(schemas.ToolAudiences))}
		for _, a := range schemas.ToolAudiences {
			info.Modes[a] = x.cfg.Policy.ModeFor(s.Name, a, s.Hints)
		}
		l.Tools = append(l.Tools, info)
	}
	return l
}

// listTimeout bounds the providers' listing for one request.
const listTimeout = 5 * time.Second

// serveTools starts the tools service on the executor's connection; the
// caller stops it.
func (x *Executor) serveTools() (micro.Service, error) {
	svc, err := micro.AddService(x.cfg.JS.Conn(), micro.Config{
		Name:        ToolsService,
		Version:     "1.0.0",
		Description: "Tollgate's tools, with the policy mode of each per audience",
		Endpoint: &micro.EndpointConfig{
			Subject: topology.SubjectToolsList,
			Handler: micro.HandlerFunc(func(req micro.Request) {
				ctx, cancel := context.WithTimeout(context.Background(), listTimeout)
				defer cancel()
				if err := req.RespondJSON(x.ListTools(ctx)); err != nil {
					x.cfg.Logger.Warn("tools list: cannot respond", "err", err)
				}
			}),
		},
	})
	if err != nil {
		return nil, fmt.Errorf("executor: serve %s: %w", topology.SubjectToolsList, err)
	}
	return svc, nil
}
