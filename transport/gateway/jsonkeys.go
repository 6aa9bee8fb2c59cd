package gateway

import (
	"bytes"
	"encoding"
	"encoding/json"
	"fmt"
	"net/http"
	"reflect"
	"strings"
	"sync"

	"github.com/tollgate-dev/tollgate/schemas"
)

// exactKeys checks the field names of JSON document data against the Go
// type of v (what it is decoded into): encoding/json matches a key to a
// field case-insensitively, with Unicode folding ("ſession_id" and
// "Session_ID" both fill session_id), while the API names each field
// exactly. A key whose exact spelling is not the JSON name of a field is
// INVALID_INPUT naming it: always when it folds to a field's name; a key
// that names no field at all only when !allowUnknown (decodeBody's
// DisallowUnknownFields reports those first). Values that decode
// themselves (json.RawMessage, tool arguments) are not looked into; maps
// and slices are, element by element. data must be valid JSON.
func exactKeys(data []byte, v any, allowUnknown bool) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	var doc any
	if err := dec.Decode(&doc); err != nil {
		return nil // the decode of v reports it
	}
	return checkKeys(doc, reflect.TypeOf(v), "", allowUnknown)
}

var (
	jsonUnmarshaler = reflect.TypeFor[json.Unmarshaler]()
	textUnmarshaler = reflect.TypeFor[encoding.TextUnmarshaler]()
)

func checkKeys(doc any, t reflect.Type, path string, allowUnknown bool) error {
	for t != nil && t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t == nil || reflect.PointerTo(t).Implements(jsonUnmarshaler) || reflect.PointerTo(t).Implements(textUnmarshaler) {
		return nil
	}
	switch t.Kind() {
	case reflect.Struct:
		obj, ok := doc.(map[string]any)
		if !ok {
			return nil
		}
		fields := jsonFieldsOf(t)
		for k, val := range obj {
			ft, ok := fields[k]
			if ok {
				if err := checkKeys(val, ft, path+k+".", allowUnknown); err != nil {
					return err
				}
				continue
			}
			near := ""
			for name := range fields {
				if strings.EqualFold(name, k) {
					near = name
				}
			}
			switch {
			case near != "":
				return errorf(http.StatusBadRequest, schemas.CodeInvalidInput, "unknown field %q: field names are matched exactly (the field is %q)", path+k, path+near)
			case !allowUnknown:
				return errorf(http.StatusBadRequest, schemas.CodeInvalidInput, "unknown field %q", path+k)
			}
		}
	case reflect.Slice, reflect.Array:
		arr, ok := doc.([]any)
		if !ok {
			return nil
		}
		for i, val := range arr {
			if err := checkKeys(val, t.Elem(), fmt.Sprintf("%s%d.", path, i), allowUnknown); err != nil {
				return err
			}
		}
	case reflect.Map:
		obj, ok := doc.(map[string]any)
		if !ok {
			return nil
		}
		for k, val := range obj {
			if err := checkKeys(val, t.Elem(), path+k+".", allowUnknown); err != nil {
				return err
			}
		}
	}
	return nil
}

// jsonFieldCache holds jsonFieldsOf's answers by struct type.
var jsonFieldCache sync.Map

// jsonFieldsOf maps the JSON names of struct t's fields (those of embedded
// structs promoted, as encoding/json does) to their types.
func jsonFieldsOf(t reflect.Type) map[string]reflect.Type {
	if m, ok := jsonFieldCache.Load(t); ok {
		return m.(map[string]reflect.Type)
	}
	m := map[string]reflect.Type{}
	for i := range t.NumField() {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name == "-" && f.Tag.Get("json") == "-" || (!f.IsExported() && !f.Anonymous) {
			continue
		}
		ft := f.Type
		for ft.Kind() == reflect.Pointer {
			ft = ft.Elem()
		}
		if f.Anonymous && name == "" && ft.Kind() == reflect.Struct {
			for k, v := range jsonFieldsOf(ft) {
				if _, outer := m[k]; !outer {
					m[k] = v
				}
			}
			continue
		}
		if !f.IsExported() {
			continue
		}
		if name == "" {
			name = f.Name
		}
		m[name] = f.Type
	}
	jsonFieldCache.Store(t, m)
	return m
}
