# One image holding Tollgate's one binary, `tollgate`: the operator CLI
# (provision, pending, audit, ...) and every component as a subcommand:
# the four stages (ingest, executor, approver, redriver), the planner, the
# gateway (API and web inbox), the Slack and Discord transports. Static
# (CGO off) on distroless, running as the nonroot user (65532). No
# ENTRYPOINT: a container names the binary and its component, e.g.
# `docker run IMAGE tollgate ingest --no-provision`
# (deploy/compose/compose.yaml sets each service's command).
#
#   docker build -t tollgate .

FROM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o /out/ ./cmd/tollgate
# The directory write_file writes into (TOLLGATE_SANDBOX), owned by nonroot
# so that a volume mounted there starts out writable.
RUN mkdir -p /data/sandbox

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/ /usr/local/bin/
COPY --from=build --chown=65532:65532 /data/ /var/lib/tollgate/
ENV TOLLGATE_SANDBOX=/var/lib/tollgate/sandbox
USER 65532:65532
CMD ["tollgate", "help"]
