package web

import (
	"bytes"
	"fmt"
	"html/template"
	"io/fs"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/tollgate-dev/tollgate/audit"
	"github.com/tollgate-dev/tollgate/reveal"
)

// page is what every page template gets.
type page struct {
	Title   string
	Session *session // nil or signed out: the header offers sign-in
	CSRF    string
	// Live: the page opens the SSE stream, from the event after After (the
	// event feed's position when the page was read: an eventfeed.Cursor).
	Live    bool
	After   string
	Message string
	Code    string        // a reason code shown with Message
	Cards   []*card       // the approval page's card (and a decision's answer without script)
	List    *listing      // the inbox's list
	Count   int           // shown in the title when not 0: the approvals waiting
	Events  []audit.Event // the turn and history pages' timeline
	Filter  url.Values    // the history page's filters
	Query   string        // the history page's query string, for its export link
	Dev     bool          // the dev sign-in form is on
	OIDC    bool          // OIDC sign-in is on
	Grants  []*grantRow   // the Grants page's rows
}

// pageNames are the templates under templates/ that are whole pages; each
// is parsed with layout.html and card.html.
var pageNames = []string{"inbox", "approval", "signin", "message", "turn", "history", "grants"}

func parsePages() (map[string]*template.Template, error) {
	funcs := template.FuncMap{
		"rfc3339": func(t time.Time) string { return t.UTC().Format(time.RFC3339) },
		"clock":   func(t time.Time) string { return t.UTC().Format("2006-01-02 15:04:05 UTC") },
		"join":    strings.Join,
		"reveal":  reveal.Must,
		"stamp":   func(t time.Time) string { return t.UTC().Format("2006-01-02 15:04:05.000") },
		"transport": func(principal string) string {
			t, _, _ := strings.Cut(principal, ":")
			return t
		},
	}
	out := map[string]*template.Template{}
	base, err := template.New("").Funcs(funcs).ParseFS(assets, "templates/layout.html", "templates/card.html", "templates/row.html", "templates/preview.html")
	if err != nil {
		return nil, fmt.Errorf("web: templates: %w", err)
	}
	out["card"] = base
	for _, name := range pageNames {
		b, err := fs.ReadFile(assets, "templates/"+name+".html")
		if err != nil {
			return nil, err
		}
		t, err := template.Must(base.Clone()).New(name).Parse(string(b))
		if err != nil {
			return nil, fmt.Errorf("web: template %s: %w", name, err)
		}
		out[name] = t
	}
	return out, nil
}

// render writes page name with status. Pages are never cached.
func (s *Server) render(w http.ResponseWriter, r *http.Request, status int, name string, p page) {
	if p.Session == nil {
		p.Session = s.sessions.get(r)
	}
	if p.Session != nil && p.CSRF == "" {
		p.CSRF = p.Session.csrf
	}
	var buf bytes.Buffer
	if err := s.pages[name].ExecuteTemplate(&buf, "layout", p); err != nil {
		s.cfg.Logger.Error("web: render", "page", name, "err", err)
		http.Error(w, "internal error", http.StatusInternalServerError)
		return
	}
	h := w.Header()
	h.Set("Content-Type", "text/html; charset=utf-8")
	h.Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_, _ = w.Write(buf.Bytes())
}

// renderCard renders one approval card as an HTML fragment.
func (s *Server) renderCard(c *card) (string, error) {
	var buf bytes.Buffer
	if err := s.pages["card"].ExecuteTemplate(&buf, "card", c); err != nil {
		return "", err
	}
	return buf.String(), nil
}

// renderRow renders one row of the list as an HTML fragment.
func (s *Server) renderRow(rw *row) (string, error) {
	var buf bytes.Buffer
	if err := s.pages["card"].ExecuteTemplate(&buf, "row", rw); err != nil {
		return "", err
	}
	return buf.String(), nil
}

// message renders a page that says msg (with a reason code, when not "").
func (s *Server) message(w http.ResponseWriter, r *http.Request, status int, title, code, msg string) {
	s.render(w, r, status, "message", page{Title: title, Code: code, Message: msg})
}
