package tools

import (
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/tollgate-dev/tollgate/schemas"
)

// schemaCache compiles input schemas (JSON Schema, draft 2020-12 unless the
// schema names another draft with $schema) once per distinct schema, keyed
// by digest, and keeps at most maxSchemas of them (past that it starts
// over, so tools that churn schemas cannot grow it without bound).
//
// A schema may refer only to itself: $ref to any other document (a file,
// a URL) does not compile, so a tool's schema can never make Tollgate read
// a file or reach the network.
type schemaCache struct {
	mu       sync.Mutex
	compiled map[[sha256.Size]byte]compiled
}

type compiled struct {
	schema *jsonschema.Schema
	err    error
}

const (
	maxSchemas = 1024
	// schemaURL names the schema being compiled in paths.
	schemaURL = "tollgate:input_schema"
)

// compile returns the compiled schema of raw (nil for an empty one: any
// JSON object is accepted), or why it does not compile.
func (c *schemaCache) compile(raw json.RawMessage) (*jsonschema.Schema, error) {
	if len(raw) == 0 {
		return nil, nil
	}
	key := sha256.Sum256(raw)
	c.mu.Lock()
	defer c.mu.Unlock()
	if r, ok := c.compiled[key]; ok {
		return r.schema, r.err
	}
	var r compiled
	r.schema, r.err = compileSchema(raw)
	if c.compiled == nil || len(c.compiled) >= maxSchemas {
		c.compiled = map[[sha256.Size]byte]compiled{}
	}
	c.compiled[key] = r
	return r.schema, r.err
}

func compileSchema(raw json.RawMessage) (*jsonschema.Schema, error) {
	doc, err := jsonschema.UnmarshalJSON(strings.NewReader(string(raw)))
	if err != nil {
		return nil, err
	}
	comp := jsonschema.NewCompiler()
	comp.UseLoader(noLoader{})
	if err := comp.AddResource(schemaURL, doc); err != nil {
		return nil, err
	}
	return comp.Compile(schemaURL)
}

// noLoader refuses every document that is not the schema itself (the
// metaschemas are built into the library and never loaded).
type noLoader struct{}

func (noLoader) Load(url string) (any, error) {
	return nil, fmt.Errorf("%s: a tool's schema may not refer to other documents", url)
}

// maxArgErrors bounds how many mismatches an ARGS_INVALID reason lists.
const maxArgErrors = 5

// check checks args against s's input schema: nil if they match, else
// ARGS_INVALID naming, for each mismatch, where it is in args, what is
// wrong and where the rule is in the schema ("at '/count': got string,
// want integer (schema #/properties/count/type)"); TOOL_UNAVAILABLE if the
// schema does not compile.
func (c *schemaCache) check(s Spec, args string) error {
	sch, err := c.compile(s.InputSchema)
	if err != nil {
		return schemas.Errorf(schemas.CodeToolUnavailable, "the input schema of %s does not compile, so its arguments cannot be checked: %v", s.Name, err)
	}
	if sch == nil {
		return nil
	}
	inst, err := jsonschema.UnmarshalJSON(strings.NewReader(args))
	if err != nil {
		return schemas.Errorf(schemas.CodeArgsInvalid, "arguments of %s are not JSON: %v", s.Name, err)
	}
	err = sch.Validate(inst)
	var ve *jsonschema.ValidationError
	if !errors.As(err, &ve) {
		if err != nil {
			return schemas.Errorf(schemas.CodeArgsInvalid, "arguments of %s: %v", s.Name, err)
		}
		return nil
	}
	var found []string
	mismatches(ve, &found)
	more := ""
	if len(found) > maxArgErrors {
		more = fmt.Sprintf("; and %d more", len(found)-maxArgErrors)
		found = found[:maxArgErrors]
	}
	return schemas.Errorf(schemas.CodeArgsInvalid, "arguments of %s do not match its schema: %s%s", s.Name, strings.Join(found, "; "), more)
}

// mismatches appends the innermost failures under e (the ones that say
// what is wrong), each with its place in the arguments and in the schema.
func mismatches(e *jsonschema.ValidationError, out *[]string) {
	if len(e.Causes) == 0 {
		_, frag, _ := strings.Cut(e.SchemaURL, "#")
		path := "#" + frag
		for _, k := range e.ErrorKind.KeywordPath() {
			path += "/" + k
		}
		*out = append(*out, fmt.Sprintf("%s (schema %s)", e.Error(), path))
		return
	}
	for _, c := range e.Causes {
		mismatches(c, out)
	}
}
