// Tollgate inbox: decide without a reload, live updates over Server-Sent
// Events, and the time left on each prompt. The pages work without it
// (plain forms); it only ever inserts HTML the server rendered.
(function () {
  'use strict';

  function parse(html) {
    var t = document.createElement('template');
    t.innerHTML = html.trim();
    return t.content.firstElementChild;
  }

  function status(text) {
    var s = document.getElementById('live-status');
    if (s) { s.textContent = text; }
  }

  function refreshEmpty() {
    var empty = document.getElementById('empty');
    var cards = document.getElementById('cards');
    if (empty && cards) { empty.hidden = cards.querySelector('article.card') !== null; }
  }

  // replace puts card in old's place. The decision's answer and the live
  // updates can arrive in either order: what old shows that card does not
  // (the verdict on this person's decision, the call's result) is kept.
  // Focus stays on the card for keyboard users.
  function replace(old, card) {
    var form = card.querySelector('form.decide');
    // A note being typed survives an update of the card (a vote).
    var note = old.querySelector('input[name=note]'), fresh = card.querySelector('input[name=note]');
    var typing = note && document.activeElement === note;
    if (note && fresh && note.value) { fresh.value = note.value; }
    ['.verdict', '.result'].forEach(function (sel) {
      var had = old.querySelector(sel);
      if (had && !card.querySelector(sel)) { card.insertBefore(had, form); }
    });
    var focused = old.contains(document.activeElement);
    old.replaceWith(card);
    if (typing && fresh && !fresh.closest('fieldset').disabled) { fresh.focus(); return; }
    if (focused) { card.setAttribute('tabindex', '-1'); card.focus(); }
  }

  // moveOn puts focus, after a decision on card, on the next card still
  // open (its heading), else on the first one before it, else leaves it
  // on card: a keyboard user goes on deciding without hunting.
  function moveOn(card) {
    if (!card || card.dataset.status === 'pending') { return; }
    var open = Array.prototype.slice.call(document.querySelectorAll('article.card[data-status=pending]'));
    var next = open.filter(function (c) { return card.compareDocumentPosition(c) & Node.DOCUMENT_POSITION_FOLLOWING; })[0] || open[open.length - 1];
    if (!next) { return; }
    var h = next.querySelector('h2');
    h.setAttribute('tabindex', '-1');
    h.focus();
  }

  // say announces text in the polite live region (new prompts, decisions
  // made elsewhere).
  function say(text) { status(text.replace(/\s+/g, ' ').trim()); }

  function pad(n) { return n < 10 ? '0' + n : String(n); }

  function tick() {
    var now = Date.now();
    document.querySelectorAll('[data-left]').forEach(function (el) {
      var card = el.closest('article.card');
      if (!card || card.dataset.status !== 'pending') { return; }
      var left = Math.floor((Date.parse(el.dataset.left) - now) / 1000);
      if (left <= 0) {
        el.textContent = 'expired';
        card.classList.add('closed');
        var fs = card.querySelector('fieldset');
        if (fs) { fs.disabled = true; }
        return;
      }
      var h = Math.floor(left / 3600), m = Math.floor(left % 3600 / 60), s = left % 60;
      el.textContent = (h > 0 ? h + 'h ' : '') + pad(m) + 'm ' + pad(s) + 's left';
    });
  }

  // signedOut says, at once, that the session has ended: the page stops
  // updating, every decision form is disabled, and it offers to sign in
  // again. It is shown only once the server says so (/session).
  var es = null;
  function signedOut() {
    if (es) { es.close(); es = null; }
    document.body.dataset.signedout = '1';
    document.querySelectorAll('form.decide fieldset, form.revoke button, form.signout button').forEach(function (el) { el.disabled = true; });
    var box = document.getElementById('signed-out');
    if (box) {
      box.hidden = false;
      var link = document.getElementById('signin-again');
      if (link) { link.focus(); }
    }
  }

  // checkSession asks the server whether this page's session is live:
  // signed out, the page says so; still live, then is called (a restart or
  // another replica broke the stream: reconnect).
  function checkSession(then) {
    fetch('/session', { credentials: 'same-origin', cache: 'no-store' }).then(function (r) {
      if (r.status === 401) { signedOut(); } else if (r.ok && then) { then(); }
    }).catch(function () {});
  }

  document.addEventListener('submit', function (e) {
    var form = e.target;
    if (!form.matches('form.decide')) { return; }
    e.preventDefault();
    var id = form.closest('article.card').id;
    var fs = form.querySelector('fieldset');
    if (fs.disabled) { return; } // a second click: the first is on its way
    var data = new URLSearchParams(new FormData(form));
    if (e.submitter && e.submitter.name) { data.set(e.submitter.name, e.submitter.value); }
    fs.disabled = true;
    status('Sending your decision…');
    fetch(form.action, {
      method: 'POST', body: data, credentials: 'same-origin',
      headers: { 'Tollgate-Fragment': 'card' }
    }).then(function (r) {
      return r.text().then(function (body) {
        var type = r.headers.get('Content-Type') || '';
        if (type.indexOf('text/html') === 0) {
          var answered = parse(body);
          replace(document.getElementById(id), answered);
          status('Decision answered: ' + (r.headers.get('Tollgate-Verdict') || r.status));
          moveOn(document.getElementById(id));
        } else if (r.status === 401) {
          signedOut();
        } else {
          fs.disabled = false;
          status(body);
        }
      });
    }).catch(function () {
      fs.disabled = false;
      status('The decision could not be sent: try again.');
    });
  });

  // after is the last event this page has: where a new stream starts.
  var after = null;
  function seen(e) { if (e.lastEventId) { after = e.lastEventId; } }

  function live() {
    if (!document.body.dataset.live || !window.EventSource || document.body.dataset.signedout) { return; }
    if (after === null) { after = document.body.dataset.after; }
    // A reconnecting EventSource sends Last-Event-ID itself.
    es = new EventSource('/events?after=' + encodeURIComponent(after));
    es.addEventListener('open', function () { document.body.dataset.connected = '1'; });
    es.addEventListener('error', function () {
      document.body.dataset.connected = '';
      // Refused (401 after a sign-out) or broken (a restart): ask.
      var closed = es && es.readyState === EventSource.CLOSED;
      if (closed) { es = null; }
      checkSession(closed ? function () { window.setTimeout(live, 1000); } : null);
    });
    es.addEventListener('prompt', function (e) {
      seen(e);
      var card = parse(e.data);
      var old = document.getElementById(card.id);
      if (old) { replace(old, card); } else {
        document.getElementById('cards').appendChild(card);
        var req = card.querySelector('.requester');
        say('New approval waiting: ' + card.querySelector('h2 code').textContent + (req ? ' requested by ' + req.textContent : ''));
      }
      refreshEmpty();
      tick();
    });
    es.addEventListener('update', function (e) {
      seen(e);
      var card = parse(e.data);
      var old = document.getElementById(card.id);
      if (!old) { return; }
      var was = old.dataset.status;
      replace(old, card);
      var why = card.querySelector('.why');
      if (was === 'pending' && card.dataset.status !== 'pending' && why) {
        say(card.querySelector('h2 code').textContent + ': ' + why.textContent);
      } else if (card.dataset.status === 'pending' && card.querySelector('.vote-count')) {
        say(card.querySelector('h2 code').textContent + ': ' + card.querySelector('.vote-count').textContent);
      }
      tick();
    });
    es.addEventListener('signedout', function () {
      es.close();
      es = null;
      checkSession(live);
    });
  }

  document.addEventListener('DOMContentLoaded', function () {
    tick();
    window.setInterval(tick, 1000);
    live();
  });
}());
