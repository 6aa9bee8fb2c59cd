// Package schemas defines Tollgate's wire and storage types and their msgpack
// encoding.
//
// Every type carries an explicit schema version in the field "v". Encoders
// always write the current version; decoders reject unknown versions with a
// *Error carrying CodeSchemaVersionUnsupported and malformed payloads with
// CodeMalformed, never guessing. Field names are short snake_case map keys so
// that a third party can read and write them from docs/protocol.md alone.
// Unknown map keys are ignored (forward compatible within a version); a
// change that alters the meaning of an existing field bumps the version.
//
// Times are msgpack timestamps (extension type -1). Byte strings that hold
// JSON (tool arguments) are msgpack str values containing canonical JSON.
package schemas
