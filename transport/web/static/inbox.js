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
    var list = document.getElementById('rows') || document.getElementById('cards');
    if (empty && list) { empty.hidden = list.querySelector('li.row, article.card') !== null; }
  }

  // The list's count of approvals waiting (as its filters select), kept
  // live, in the page's title and above the list.
  var rows = null, count = 0, fresh = 0, closedIDs = {};
  function showCount() {
    if (!rows) { return; }
    document.title = (count > 0 ? '(' + count + ') ' : '') + 'Approvals · Tollgate';
    var total = document.getElementById('total');
    if (total) { total.textContent = String(count); }
  }

  // filtered reports whether the list has a filter on.
  function filtered() {
    return ['tool', 'requester', 'channel', 'transport'].some(function (k) { return rows.dataset[k]; });
  }

  // matches reports whether row r passes the list's filters.
  function matches(r) {
    return ['tool', 'requester', 'channel', 'transport'].every(function (k) { return !rows.dataset[k] || rows.dataset[k] === r.dataset[k]; });
  }

  // closed notes that approval id is no longer pending (status): its row
  // says so and the count drops, once.
  function closed(id, status) {
    var r = document.getElementById('row-' + id);
    if (r) { r.dataset.status = status; r.classList.add('closed'); }
    if (!rows || closedIDs[id] || !(r || !filtered())) { return; }
    closedIDs[id] = true;
    count = Math.max(count - 1, 0);
    showCount();
  }

  // insertRow puts a new row where the list's order puts it, on the first
  // page only (other pages link to it).
  function insertRow(r) {
    if (rows.dataset.page !== '1') { return false; }
    var all = rows.querySelectorAll('li.row'), before = all[0] || null;
    if (rows.dataset.sort === 'expiry') {
      var exp = r.dataset.expires ? Date.parse(r.dataset.expires) : Infinity;
      before = null;
      for (var i = 0; i < all.length; i++) {
        var e = all[i].dataset.expires ? Date.parse(all[i].dataset.expires) : Infinity;
        if (exp < e) { before = all[i]; break; }
      }
      if (!before && all.length >= 50) { return false; } // it belongs on a later page
    }
    rows.insertBefore(r, before);
    return true;
  }

  // announceNew counts one more new prompt in the "N new" notice.
  function announceNew() {
    fresh++;
    var box = document.getElementById('new-notice'), link = document.getElementById('new-link');
    if (!box || !link) { return; }
    link.textContent = fresh + ' new ' + (fresh === 1 ? 'approval' : 'approvals') + (rows.dataset.page === '1' ? ': go to the newest' : ': show the first page');
    box.hidden = false;
  }

  // rowOf is the list's row that holds el (or el itself).
  function rowOf(el) { return el && el.closest ? el.closest('li.row') : null; }

  function focusRow(r) {
    if (!r) { return; }
    var s = r.querySelector('summary');
    s.focus();
    r.scrollIntoView({ block: 'nearest' });
  }

  // openRow opens r's card in place, fetching it when the row has only a
  // link; then calls then(card).
  function openRow(r, then) {
    var d = r.querySelector('details');
    d.open = true;
    var have = r.querySelector('article.card');
    if (have) { if (then) { then(have); } return; }
    if (r.dataset.loading) { return; }
    r.dataset.loading = '1';
    fetch('/approvals/' + encodeURIComponent(r.dataset.approval), { credentials: 'same-origin', headers: { 'Tollgate-Fragment': 'card' } }).then(function (resp) {
      if (resp.status === 401) { signedOut(); return null; }
      return resp.ok ? resp.text() : null;
    }).then(function (body) {
      delete r.dataset.loading;
      if (!body) { return; }
      var card = parse(body);
      r.querySelector('.row-card').replaceChildren(card);
      tick();
      if (then) { then(card); }
    }).catch(function () { delete r.dataset.loading; });
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
    var row = rowOf(card);
    if (row) {
      closed(row.dataset.approval, card.dataset.status);
      var pending = Array.prototype.slice.call(document.querySelectorAll('li.row[data-status=pending]'));
      focusRow(pending.filter(function (c) { return row.compareDocumentPosition(c) & Node.DOCUMENT_POSITION_FOLLOWING; })[0] || pending[pending.length - 1]);
      return;
    }
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
      var card = el.closest('article.card') || el.closest('li.row');
      if (!card || card.dataset.status !== 'pending') { return; }
      var left = Math.floor((Date.parse(el.dataset.left) - now) / 1000);
      if (left <= 0) {
        el.textContent = 'expired';
        card.classList.add('closed');
        var fs = card.querySelector('article.card fieldset');
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
      var r = parse(e.data);
      if (!rows || document.getElementById(r.id) || !matches(r)) { return; }
      count++;
      showCount();
      insertRow(r);
      announceNew();
      say('New approval waiting: ' + r.dataset.tool + (r.dataset.requester ? ' requested by ' + r.dataset.requester : ''));
      refreshEmpty();
      tick();
    });
    es.addEventListener('update', function (e) {
      seen(e);
      var card = parse(e.data);
      var old = document.getElementById(card.id), row = document.getElementById('row-' + card.id);
      if (card.dataset.status !== 'pending') { closed(card.id, card.dataset.status); }
      if (!old && row) {
        // A row whose card is not open yet: the card waits in it.
        row.querySelector('.row-card').replaceChildren(card);
        old = null;
        if (card.dataset.status !== 'pending') { say(card.querySelector('h2 code').textContent + ': ' + (card.querySelector('.why') || card).textContent); }
        return;
      }
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

  // Opening a row fetches its card when the row has only its link.
  document.addEventListener('toggle', function (e) {
    var r = rowOf(e.target);
    if (r && e.target.open && e.target.parentNode === r) { openRow(r); }
  }, true);

  // Keyboard shortcuts (listed on the page): j/k next/previous row, o
  // open or close it (Enter on a row does too), a/d approve/deny its open
  // card through the card's own form (its CSRF token and digest, the same
  // submit as the buttons); a closed card is opened first, and decided by
  // a second press once the person has seen it.
  document.addEventListener('keydown', function (e) {
    if (!rows || e.altKey || e.ctrlKey || e.metaKey || e.isComposing) { return; }
    var t = e.target;
    if (t && (t.isContentEditable || /^(INPUT|TEXTAREA|SELECT|BUTTON)$/.test(t.tagName))) { return; }
    var all = Array.prototype.slice.call(rows.querySelectorAll('li.row'));
    var cur = rowOf(document.activeElement), i = all.indexOf(cur);
    switch (e.key) {
      case 'j': focusRow(all[Math.min(i + 1, all.length - 1)]); break;
      case 'k': focusRow(all[Math.max(i - 1, 0)]); break;
      case 'o':
        if (!cur) { return; }
        if (cur.querySelector('details').open) { cur.querySelector('details').open = false; } else { openRow(cur); }
        break;
      case 'a': case 'd':
        if (!cur) { return; }
        var option = e.key === 'a' ? 'approve' : 'deny';
        if (!cur.querySelector('details').open || !cur.querySelector('article.card')) {
          openRow(cur, function () { say('Card opened: press ' + e.key + ' again to ' + option + '.'); });
          break;
        }
        var form = cur.querySelector('form.decide'), button = form && form.querySelector('button.opt-' + option);
        if (!button || button.disabled || form.querySelector('fieldset').disabled) { say('This card cannot be decided now.'); break; }
        form.requestSubmit(button);
        break;
      default: return;
    }
    e.preventDefault();
  });

  document.addEventListener('DOMContentLoaded', function () {
    rows = document.getElementById('rows');
    if (rows) {
      count = parseInt(rows.dataset.count, 10) || 0;
      document.getElementById('new-link').addEventListener('click', function (e) {
        var first = rows.querySelector('li.row.new');
        if (rows.dataset.page === '1' && first) { e.preventDefault(); focusRow(first); }
      });
    }
    tick();
    window.setInterval(tick, 1000);
    live();
  });
}());
