"""Page -> text observation for the web env: interactive and text elements with stable ids, bounded.

The reduction runs inside the page (one round trip), so a 5 MB page never crosses to Python: the walk
visits at most MAX_VISIT elements, clips every label and value, and stops at a character budget.
Python bounds the result again and strips control characters: the observation is plain text that
prompts and the dashboard show as text. Scripts, styles and hidden elements are never read.

Ids are stamped on elements as an attribute (a per-env random name, so a page cannot forge them) in
document order the first time an element is seen; re-observing a page keeps them, and replaying the
same commands on the same site reproduces them.
"""

from __future__ import annotations

import re
from typing import Any

MAX_VISIT = 5000
MAX_LABEL = 100
MAX_TEXT = 200
MAX_OPTIONS = 6
MAX_CONTROLS = 200

# args: {attr, budget, maxVisit, maxLabel, maxText, maxOptions, maxControls}
OBSERVE_JS = r"""
(o) => {
  const SKIP = new Set(['SCRIPT','STYLE','NOSCRIPT','TEMPLATE','HEAD','META','LINK','IFRAME','OBJECT','EMBED',
                        'CANVAS','svg','SVG','VIDEO','AUDIO']);
  const clip = (s, n) => { s = String(s == null ? '' : s).replace(/\s+/g, ' ').trim();
                           return s.length > n ? s.slice(0, n) + '…' : s; };
  const ROLES = /^(button|link|checkbox|radio|tab|menuitem|option|switch|textbox|combobox)$/;
  const isInteractive = (el) => {
    const t = el.tagName;
    if (t === 'A') return el.hasAttribute('href');
    if (t === 'BUTTON' || t === 'SELECT' || t === 'TEXTAREA' || t === 'SUMMARY') return true;
    if (t === 'INPUT') return el.type !== 'hidden';
    const role = el.getAttribute('role');
    return (role && ROLES.test(role)) || el.isContentEditable;
  };
  const kindOf = (el) => {
    const t = el.tagName;
    if (t === 'A') return 'link';
    if (t === 'BUTTON' || t === 'SUMMARY') return 'button';
    if (t === 'SELECT') return 'select';
    if (t === 'TEXTAREA') return 'textbox';
    if (t === 'INPUT') {
      const ty = el.type;
      if (['submit', 'button', 'reset', 'image'].includes(ty)) return 'button';
      if (ty === 'checkbox' || ty === 'radio') return ty;
      return ['text', 'search', 'email', 'tel', 'url', 'password', 'number'].includes(ty) ? 'textbox' : 'input:' + ty;
    }
    return el.getAttribute('role') || 'editable';
  };
  const labelOf = (el, kind) => {
    const aria = el.getAttribute('aria-label');
    if (aria) return aria;
    if (el.tagName === 'INPUT' && kind === 'button') return el.value;
    if (['INPUT', 'SELECT', 'TEXTAREA'].includes(el.tagName)) {
      const lab = el.labels && el.labels[0];
      return (lab && lab.textContent) || el.getAttribute('placeholder') || el.getAttribute('name') || el.title || '';
    }
    const img = el.querySelector('img[alt]');
    return el.textContent || (img && img.alt) || el.title || '';
  };
  const visible = (el) => !el.checkVisibility || el.checkVisibility({checkVisibilityCSS: true});
  let next = window.__orchardNext || 1;
  const items = [];
  let visited = 0, chars = 0, above = 0, truncated = false;
  const scrolled = window.scrollY > 0;
  const root = document.body || document.documentElement;
  const stack = root ? [root] : [];
  while (stack.length) {
    const el = stack.pop();
    if (++visited > o.maxVisit || chars > o.budget) { truncated = true; break; }
    if (SKIP.has(el.tagName) || !visible(el)) continue;
    const interactive = isInteractive(el);
    let item = null;
    if (interactive) {
      if (!el.hasAttribute(o.attr)) el.setAttribute(o.attr, String(next++));
      const kind = kindOf(el);
      item = {id: Number(el.getAttribute(o.attr)) || 0, kind: kind, label: clip(labelOf(el, kind), o.maxLabel)};
      if (el.tagName === 'SELECT') {
        const opts = Array.from(el.options);
        const sel = el.selectedIndex >= 0 ? opts[el.selectedIndex] : null;
        item.value = clip(sel ? sel.textContent : '', o.maxLabel);
        item.options = opts.slice(0, o.maxOptions).map(x => clip(x.textContent, 40));
        item.n_options = opts.length;
      } else if (kind === 'checkbox' || kind === 'radio') {
        item.value = el.checked ? 'checked' : 'unchecked';
      } else if (kind === 'textbox' || kind.startsWith('input:')) {
        item.value = el.type === 'password' ? '*'.repeat(Math.min(el.value.length, 8)) : clip(el.value, o.maxLabel);
      }
    } else if (!(el.tagName === 'LABEL' && el.control)) {  // a control's label is shown on the control
      let text = '';
      for (const c of el.childNodes) if (c.nodeType === 3) { text += c.nodeValue; if (text.length > o.maxText * 2) break; }
      text = clip(text, o.maxText);
      if (text) item = {id: null, kind: /^H[1-6]$/.test(el.tagName) ? 'heading' : 'text', label: text};
    }
    if (item) {
      if (scrolled && el.getBoundingClientRect().bottom < 0) { above++; }
      else { items.push(item); chars += item.label.length + (item.value || '').length + 20; }
    }
    if (!interactive) for (let i = el.children.length - 1; i >= 0; i--) stack.push(el.children[i]);
  }
  window.__orchardNext = next;
  const controls = Array.from(document.querySelectorAll('input, select, textarea')).slice(0, o.maxControls)
    .map(e => (e.type === 'checkbox' || e.type === 'radio') ? e.checked : clip(e.value, 2000));
  return {title: clip(document.title, o.maxLabel), url: location.href, items: items, truncated: truncated,
          above: above, controls: controls,
          scroll: [Math.round(window.scrollY), Math.round(Math.max(0, root ? root.scrollHeight - innerHeight : 0))]};
}
"""

# Put form controls back (a snapshot's values, in document order), then scroll.
SET_CONTROLS_JS = r"""
([values, y]) => {
  const els = Array.from(document.querySelectorAll('input, select, textarea'));
  values.forEach((v, i) => {
    const e = els[i];
    if (!e) return;
    if (typeof v === 'boolean') e.checked = v; else if (e.type !== 'file') e.value = v;
  });
  window.scrollTo(0, y);
}
"""

_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f\u2028\u2029]")


def clean(text: Any, limit: int) -> str:
    """One line of page text: control characters removed, whitespace collapsed, clipped."""
    out = " ".join(_CONTROL.sub(" ", str(text)[: 4 * limit + 64]).split())  # cut first: inputs may be huge
    return out if len(out) <= limit else out[: limit - 1] + "…"


def render(data: dict[str, Any], max_chars: int) -> str:
    """The observation text for OBSERVE_JS's result, at most `max_chars` characters."""
    head = [f"Page: {clean(data.get('title', ''), MAX_LABEL)}", f"URL: {clean(data.get('url', ''), 300)}"]
    if data.get("above"):
        head.append(f"({data['above']} elements above; SCROLL UP to see them)")
    lines, used = [], sum(len(h) + 1 for h in head)
    budget = max_chars - 80
    for item in data.get("items", [])[:2000]:
        line = _line(item)
        if used + len(line) + 1 > budget:
            lines.append("(page truncated: SCROLL DOWN or act on what is shown)")
            break
        lines.append(line)
        used += len(line) + 1
    else:
        if data.get("truncated"):
            lines.append("(page truncated: it is too large to show whole)")
    y, y_max = (data.get("scroll") or [0, 0])[:2]
    if y_max > 50:
        lines.append(f"(scrolled {y} of {y_max} px)")
    return "\n".join(head + lines)[:max_chars]


def _line(item: dict[str, Any]) -> str:
    kind = clean(item.get("kind", ""), 20)
    label = clean(item.get("label", ""), MAX_TEXT)
    if item.get("id") is None:
        return f'{kind} "{label}"'
    line = f'[{int(item["id"])}] {kind} "{label}"'
    if "value" in item:
        line += f' value="{clean(item["value"], MAX_LABEL)}"'
    if item.get("options") is not None:
        opts = " | ".join(clean(o, 40) for o in item["options"][:MAX_OPTIONS])
        more = int(item.get("n_options", 0)) - MAX_OPTIONS
        line += f" options: {opts}" + (f" | … ({more} more)" if more > 0 else "")
    return line
