"""The Kinetic pages as HTML strings: every value from a store or a user is escaped.

Plain string templates (no template engine, no JavaScript build): a page is a table
or two, and the live log is a small fetch loop that appends text with
``textContent`` (never ``innerHTML``).  Links are built from the mount point the
API server gave the app (``base``), so the pages work under a base URL path too.
Usage (``core.jobs.usage``) comes after a job's own columns and facts, so the list
reads as before with the usage on its right.
"""

from __future__ import annotations

import urllib.parse
from html import escape
from typing import Any

from airflow_provider_kinetic.cli.output import human_age
from airflow_provider_kinetic.core.jobs.progress import Progress
from airflow_provider_kinetic.plugins.jobs import JobDetail, JobRow

STYLE = """
body{font-family:system-ui,sans-serif;margin:1.2rem;color:#1a202c}
table{border-collapse:collapse;width:100%;font-size:.9rem}
th,td{border-bottom:1px solid #e2e8f0;padding:.3rem .5rem;text-align:left;vertical-align:top}
th{background:#f7fafc}
.state{font-weight:600}
.SUCCEEDED{color:#2f855a}.FAILED,.NOT_FOUND{color:#c53030}.CANCELLED{color:#718096}
.RUNNING,.PENDING{color:#2b6cb0}
pre#log{background:#1a202c;color:#e2e8f0;padding:.8rem;max-height:70vh;overflow:auto;
white-space:pre-wrap}
button{padding:.3rem .8rem}
nav{margin-bottom:1rem}
"""

LOG_SCRIPT = """
(function(){
  const page=document.getElementById('job');
  const logEl=document.getElementById('log');
  const stateEl=document.getElementById('state');
  const logUrl=page.dataset.logUrl;
  let offset=0;
  async function poll(){
    let done=false;
    try{
      const r=await fetch(logUrl+(logUrl.includes('?')?'&':'?')+'offset='+offset,
                          {credentials:'same-origin',headers:{'Accept':'application/json'}});
      if(r.ok){
        const d=await r.json();
        if(d.text){logEl.append(document.createTextNode(d.text));
                   logEl.scrollTop=logEl.scrollHeight;}
        offset=d.offset;
        stateEl.textContent=d.state+(d.reason?' ('+d.reason+')':'')
          +(d.state==='PENDING'&&d.message?': '+d.message:'');
        stateEl.className='state '+d.state;
        const p=document.getElementById('progress');
        if(p&&d.progress){const bar=p.querySelector('progress');
          if(d.progress.fraction!==null){bar.value=d.progress.fraction;bar.hidden=false;}
          p.querySelector('.progress-text').textContent=d.progress.text;}
        done=d.terminal;
        page.dataset.terminal=String(done);
      }
    }catch(e){}
    if(!done){setTimeout(poll,1000);}else{logEl.dataset.complete='true';}
  }
  poll();
  const cancel=document.getElementById('cancel');
  if(cancel){cancel.addEventListener('click',async function(){
    if(!confirm('Cancel job '+page.dataset.jobId+'?'))return;
    cancel.disabled=true;
    const r=await fetch(cancel.dataset.url,{method:'POST',credentials:'same-origin',
                        headers:{'X-Kinetic-Action':'cancel'}});
    document.getElementById('cancel-result').textContent=
      r.ok?'cancel requested':'cancel failed: '+r.status+' '+(await r.text());
  });}
})();
"""


def _link(base: str, path: str, conn_id: str, **params: str) -> str:
    query = {**({"conn_id": conn_id} if conn_id != "kinetic_default" else {}), **params}
    return base + path + ("?" + urllib.parse.urlencode(query) if query else "")


def page(title: str, body: str) -> str:
    return (
        "<!doctype html><html lang='en'><head><meta charset='utf-8'>"
        f"<title>{escape(title)}</title><style>{STYLE}</style></head>"
        f"<body>{body}</body></html>"
    )


def _task(row: JobRow) -> str:
    parts = [row.dag_id or "?", row.run_id or "?", row.task_id or "?"]
    if row.map_index not in (None, "-1"):
        parts.append(f"[{row.map_index}]")
    return " / ".join(parts) if row.dag_id or row.task_id else ""


def _state(row: JobRow) -> str:
    state = row.report.status.value
    reason = f" ({row.report.reason})" if row.report.reason else ""
    return f"<span class='state {escape(state)}'>{escape(state + reason)}</span>"


#: The list's columns: the job's own, then its usage (an estimated cost last, if priced).
JOB_COLUMNS = ("Job", "Status", "Accelerator", "Backend", "DAG / run / task", "Start", "End")
USAGE_COLUMNS = ("Capacity", "Queued", "Run", "Chip-hours")


def _hours(value: float) -> str:
    return f"{value:.0f}" if value >= 100 else f"{value:.2f}" if value >= 1 else f"{value:.3g}"


def _usage_cells(usage: dict[str, Any] | None, priced: bool) -> dict[str, str]:
    """Usage as the page shows it, by column: capacity, queued, run, chip-hours (and
    the estimated cost, ``priced``); empty where the history knows nothing."""
    if not usage:
        return dict.fromkeys(USAGE_COLUMNS + (("Est. cost",) if priced else ()), "")
    first = (usage.get("attempts_detail") or [{}])[0]
    queued = first.get("queued_s")
    if usage["jobs"] and usage["unmeasured_jobs"] >= usage["jobs"]:
        run = "unknown"
    else:
        run = human_age(usage["run_s"]) or "0s"
        run += f" over {usage['jobs']} jobs" if first.get("kind") == "batch" else ""
        run += " (running)" if usage["running"] else ""
    chips = "no chips" if usage.get("family") is None else _hours(usage["chip_hours"])
    cells = {
        "Capacity": str(usage.get("capacity") or ""),
        "Queued": "" if queued is None else human_age(queued) or "0s",
        "Run": run,
        "Chip-hours": chips,
    }
    if priced:  # CPUs have no chips: never priced
        cost, unpriced = usage.get("cost"), usage.get("unpriced_chip_hours")
        cells["Est. cost"] = (
            ""
            if usage.get("family") is None
            else "not in the price table"
            if unpriced
            else f"${cost or 0:,.2f}"
        )
    return cells


def _usage_values(usage: dict[str, Any] | None) -> dict[str, float]:
    """The numbers behind the usage cells (seconds, chip-hours, USD), for scripts and
    tests reading the page: only those the cells show."""
    if not usage:
        return {}
    first = (usage.get("attempts_detail") or [{}])[0]
    values = {
        "Queued": first.get("queued_s"),
        "Run": usage["run_s"],
        "Est. cost": usage.get("cost"),
    }
    if usage.get("family") is not None:
        values["Chip-hours"] = usage["chip_hours"]
    if usage["jobs"] and usage["unmeasured_jobs"] >= usage["jobs"]:
        del values["Run"]
    return {name: float(v) for name, v in values.items() if v is not None}


def _usage_cell(name: str, text: str, values: dict[str, float]) -> str:
    value = f" data-value='{values[name]!r}'" if name in values else ""
    return f"<td class='usage' data-usage='{escape(name.lower())}'{value}>{escape(text)}</td>"


def jobs_page(rows: list[JobRow], base: str, conn_id: str, group: str | None) -> str:
    """The jobs list: newest first, one row per job, each linking to its page, with its
    usage (an estimated cost column only when a price table priced something)."""
    priced = any(row.usage and "cost" in row.usage for row in rows)
    usage_heads = USAGE_COLUMNS + (("Est. cost",) if priced else ())
    head = "".join(f"<th>{h}</th>" for h in (*JOB_COLUMNS, *usage_heads))
    body = []
    for row in rows:
        cells, values = _usage_cells(row.usage, priced), _usage_values(row.usage)
        usage = "".join(_usage_cell(name, cells[name], values) for name in usage_heads)
        href = (
            _link(base, "/", conn_id, group=row.job_id)  # a batch: its children
            if row.batch
            else _link(base, "/jobs/" + urllib.parse.quote(row.job_id, safe=""), conn_id)
        )
        body.append(
            f"<tr data-job-id='{escape(row.job_id)}'>"
            f"<td><a href='{escape(href)}'>{escape(row.job_id)}</a></td>"
            f"<td>{_state(row)}</td><td>{escape(row.handle.accelerator)}</td>"
            f"<td>{escape(row.handle.backend)}</td><td>{escape(_task(row))}</td>"
            f"<td>{escape(row.started)}</td><td>{escape(row.ended)}</td>{usage}</tr>"
        )
    title = "Kinetic jobs" + (f" of batch {group}" if group else "")
    empty = "" if rows else "<p id='no-jobs'>No kinetic jobs in this store.</p>"
    return page(
        title,
        f"<nav><a id='keys-link' href='{escape(_link(base, '/keys', conn_id))}'>Keys</a></nav>"
        f"<h1>{escape(title)}</h1><p>Connection <code>{escape(conn_id)}</code></p>"
        f"<table id='jobs'><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody>"
        f"</table>{empty}",
    )


def _usage_facts(info: JobDetail) -> list[tuple[str, str]]:
    """The job page's usage rows: the task log's line, then each figure."""
    usage = info.row.usage
    if not usage:
        return []
    cells = _usage_cells(usage, "cost" in usage)
    first = (usage.get("attempts_detail") or [{}])[0]
    if first.get("admission_wait_s") is not None:
        admission = human_age(first["admission_wait_s"]) or "0s"
        start = human_age(first["start_wait_s"]) or "0s"
        cells["Queued"] += f" ({admission} for admission, {start} to start)"
    facts = [("Usage", f"<span id='usage'>{escape(info.usage_line)}</span>")]
    return facts + [(name, escape(value)) for name, value in cells.items()]


def progress_html(last: Progress | None, job_id: str) -> str:
    """A job's last progress report (``core.jobs.progress``): a bar (with a total) and
    its text (step, percent, ETA, metrics); the pages' scripts update both from the
    log feed while the job runs."""
    value = f"{last.fraction:.4f}" if last is not None and last.fraction is not None else ""
    bar = f"<progress max='1' value='{value or 0}'{'' if value else ' hidden'}></progress> "
    text = escape(last.describe()) if last is not None else "none reported"
    return (
        f"<span id='progress' data-job-id='{escape(job_id)}'>{bar}"
        f"<span class='progress-text'>{text}</span></span>"
    )


def job_page(info: JobDetail, base: str, conn_id: str, *, can_cancel: bool = False) -> str:
    """One job: its facts, output files, the live log and, while it runs and for a user
    allowed to cancel it (``can_cancel``), a cancel button."""
    row = info.row
    quoted = urllib.parse.quote(row.job_id, safe="")
    facts = [
        (
            "Status",
            f"<span id='state' class='state {escape(row.report.status.value)}'>"
            f"{escape(row.report.describe())}</span>",
        ),
        ("Progress", progress_html(None, row.job_id)),  # filled by the log feed
        ("Accelerator", escape(row.handle.accelerator)),
        *([("Slices", escape(str(slices)))] if (slices := row.handle.num_slices or 1) > 1 else []),
        ("Backend", escape(row.handle.backend)),
        ("Function", escape(row.handle.func_name)),
        ("DAG / run / task", escape(_task(row))),
        ("Start", escape(row.started)),
        ("End", escape(row.ended)),
        *_usage_facts(info),
        ("Batch", escape(row.handle.group_id or "")),
        ("Output dir", f"<code>{escape(info.output_dir or '')}</code>"),
        ("Artifacts", f"<code>{escape(info.artifacts)}</code>"),
    ]
    table = "".join(f"<tr><th>{k}</th><td>{v}</td></tr>" for k, v in facts)
    files = "".join(
        f"<li><a href='{escape(_link(base, f'/jobs/{quoted}/files', conn_id, name=f.name))}'>"
        f"{escape(f.name)}</a> ({f.size} bytes)</li>"
        for f in info.files
    )
    more = "<li>(more files not shown)</li>" if info.files_truncated else ""
    cancel_url = _link(base, f"/jobs/{quoted}/cancel", conn_id)
    cancel = (
        ""
        if row.terminal or not can_cancel
        else f"<button id='cancel' data-url='{escape(cancel_url)}'>Cancel job</button> "
        "<span id='cancel-result'></span>"
    )
    log_url = _link(base, f"/api/jobs/{quoted}/log", conn_id)
    back = _link(base, "/", conn_id)
    return page(
        f"Kinetic job {row.job_id}",
        f"<nav><a href='{escape(back)}'>All kinetic jobs</a></nav>"
        f"<div id='job' data-job-id='{escape(row.job_id)}' data-log-url='{escape(log_url)}' "
        f"data-terminal='{str(row.terminal).lower()}'>"
        f"<h1>Kinetic job {escape(row.job_id)}</h1><table>{table}</table>{cancel}"
        f"<h2>Output files</h2><ul id='files'>{files or '<li>none</li>'}{more}</ul>"
        f"<h2>Log</h2><pre id='log'></pre></div><script>{LOG_SCRIPT}</script>",
    )


def error_page(status: int, message: str) -> str:
    return page(f"Kinetic: {status}", f"<h1>{status}</h1><p id='error'>{escape(message)}</p>")
