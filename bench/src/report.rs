//! The files a run leaves behind: `bench.json` (every sample's summary), `latency.svg`
//! (handoff and crash-release medians per tool, min–max whiskers, log scale) and
//! `BENCHMARKS.md` (the tables in markdown, with the machine they came from). std only.

use std::fmt::Write as _;

use crate::stats::{Ratio, Row, Unit, fmt_value};

fn unit_name(u: Unit) -> &'static str {
    match u {
        Unit::Ms => "ms",
        Unit::MiB => "MiB",
        Unit::Count => "count",
    }
}

/// A JSON string literal.
fn js(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// A JSON number (NaN and infinities, which JSON lacks, as null).
fn jn(v: f64) -> String {
    if v.is_finite() {
        format!("{v:.4}")
    } else {
        "null".into()
    }
}

pub fn json(rows: &[Row], head: &str, date: &str) -> String {
    let mut out = String::from("{\n");
    let _ = writeln!(out, "  \"date\": {},", js(date));
    let _ = writeln!(out, "  \"about\": {},", js(head.trim_end()));
    out.push_str("  \"rows\": [\n");
    for (i, r) in rows.iter().enumerate() {
        let ratio = match r.ratio {
            Ratio::IsReference => "\"reference\"".to_string(),
            Ratio::Vs(_) => r.ratio().map_or("null".into(), jn),
            Ratio::None => "null".into(),
        };
        let _ = write!(
            out,
            "    {{\"metric\": {}, \"tool\": {}, \"unit\": {}, \"n\": {}, \"median\": {}, \"min\": {}, \"max\": {}, \"ratio\": {}}}",
            js(&r.metric),
            js(&r.tool),
            js(unit_name(r.unit)),
            r.samples.len(),
            jn(r.samples.median()),
            jn(r.samples.min()),
            jn(r.samples.max()),
            ratio
        );
        out.push_str(if i + 1 < rows.len() { ",\n" } else { "\n" });
    }
    out.push_str("  ]\n}\n");
    out
}

/// XML text.
fn xml(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// Horizontal bars of the medians of the latency metrics, min–max whiskers, on a log scale
/// (the polling rivals take seconds where the rest take fractions of a millisecond).
pub fn svg(rows: &[Row]) -> String {
    let metrics = [
        "handoff",
        "handoff, dot-lock rivals",
        "crash release",
        "helper killed",
        "FTP parent SIGKILL → lock gone",
        "FTP handoff (holder's pipe closed → waiter's OK)",
        "sshfs: handoff, holder on mount a → waiter on mount b",
        "sshfs: helper killed on mount a → waiter on mount b holds",
    ];
    let groups: Vec<(&str, Vec<&Row>)> = metrics
        .iter()
        .map(|m| {
            (
                *m,
                rows.iter()
                    .filter(|r| r.metric == *m && r.unit == Unit::Ms)
                    .collect(),
            )
        })
        .filter(|(_, v): &(&str, Vec<&Row>)| !v.is_empty())
        .collect();
    let (label_w, plot_w, bar_h, gap) = (470.0, 520.0, 16.0, 26.0);
    let n_bars: usize = groups.iter().map(|(_, v)| v.len()).sum();
    let height = 60.0 + groups.len() as f64 * gap + n_bars as f64 * (bar_h + 4.0) + 40.0;
    let width = label_w + plot_w + 40.0;
    // Log scale over decades covering every value (1 µs – 1 s when there is none: a run of
    // only sections the chart does not show).
    let mut vals: Vec<f64> = groups
        .iter()
        .flat_map(|(_, v)| v.iter().flat_map(|r| [r.samples.min(), r.samples.max()]))
        .filter(|v| v.is_finite() && *v > 0.0)
        .collect();
    if vals.is_empty() {
        vals = vec![1e-3, 1e3];
    }
    let lo = vals
        .iter()
        .copied()
        .fold(f64::INFINITY, f64::min)
        .max(1e-3)
        .log10()
        .floor();
    let hi = vals
        .iter()
        .copied()
        .fold(0.0, f64::max)
        .max(1.0)
        .log10()
        .ceil()
        .max(lo + 1.0);
    let x = |v: f64| label_w + (v.max(10f64.powf(lo)).log10() - lo) / (hi - lo) * plot_w;
    let mut out = String::new();
    let _ = writeln!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0}" height="{height:.0}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(
        out,
        r#"<rect width="100%" height="100%" fill="white"/><text x="10" y="20" font-size="15" font-weight="bold">Latency per tool: median (bar), min–max (line); log scale, ms</text>"#
    );
    let axis_y = height - 30.0;
    let mut d = lo;
    while d <= hi {
        let xv = x(10f64.powf(d));
        let label = fmt_value(10f64.powf(d), Unit::Ms);
        let _ = writeln!(
            out,
            r##"<line x1="{xv:.1}" y1="40" x2="{xv:.1}" y2="{axis_y:.1}" stroke="#ddd"/><text x="{xv:.1}" y="{:.1}" text-anchor="middle" fill="#555">{}</text>"##,
            axis_y + 15.0,
            xml(&label)
        );
        d += 1.0;
    }
    let mut y = 50.0;
    for (metric, bars) in &groups {
        let _ = writeln!(
            out,
            r#"<text x="10" y="{:.1}" font-weight="bold">{}</text>"#,
            y + 12.0,
            xml(metric)
        );
        y += gap;
        for r in bars {
            let (med, mn, mx) = (r.samples.median(), r.samples.min(), r.samples.max());
            let color = if r.tool.starts_with("locksmith") {
                "#2b6cb0"
            } else {
                "#a0aec0"
            };
            let mut tool = r.tool.clone();
            if tool.chars().count() > 70 {
                tool = tool.chars().take(68).collect::<String>() + "…";
            }
            let _ = writeln!(
                out,
                r##"<text x="{:.1}" y="{:.1}" text-anchor="end">{}</text><rect x="{label_w:.1}" y="{y:.1}" width="{:.1}" height="{bar_h:.1}" fill="{color}"/><line x1="{:.1}" y1="{:.1}" x2="{:.1}" y2="{:.1}" stroke="#222"/><text x="{:.1}" y="{:.1}" fill="#222">{}</text>"##,
                label_w - 8.0,
                y + 12.0,
                xml(&tool),
                (x(med) - label_w).max(1.0),
                x(mn),
                y + bar_h / 2.0,
                x(mx),
                y + bar_h / 2.0,
                x(mx) + 4.0,
                y + 12.0,
                xml(&fmt_value(med, Unit::Ms)),
            );
            y += bar_h + 4.0;
        }
    }
    out.push_str("</svg>\n");
    out
}

pub fn markdown(rows: &[Row], head: &str, targets: &str, notes: &[String], date: &str) -> String {
    let mut out = String::from("# Benchmarks\n\n");
    let _ = writeln!(
        out,
        "Written by `cargo run --release -p locksmith-bench` ({date}); re-run it to check. Method: \
         [`bench/README.md`](bench/README.md). Chart: [`docs/latency.svg`](docs/latency.svg).\n"
    );
    for l in head.lines() {
        let _ = writeln!(out, "- {l}");
    }
    out.push('\n');
    let mut metric = "";
    for r in rows {
        if r.metric != metric {
            metric = &r.metric;
            let _ = writeln!(
                out,
                "\n## {metric}\n\n| tool | n | median | min – max | ratio |\n| --- | ---: | ---: | ---: | ---: |"
            );
        }
        let ratio = match r.ratio {
            Ratio::IsReference => "ref".to_string(),
            Ratio::Vs(_) => r.ratio().map_or("-".into(), |x| format!("{x:.2}×")),
            Ratio::None => "-".into(),
        };
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} – {} | {ratio} |",
            r.tool.replace('|', "\\|"),
            r.samples.len(),
            fmt_value(r.samples.median(), r.unit),
            fmt_value(r.samples.min(), r.unit),
            fmt_value(r.samples.max(), r.unit),
        );
    }
    if !targets.is_empty() {
        let _ = writeln!(out, "\n## Targets\n\n```text\n{}```\n", targets);
    }
    if !notes.is_empty() {
        out.push_str("## Notes\n\n");
        for n in notes {
            let _ = writeln!(out, "- {n}");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stats::Samples;

    fn row(metric: &str, tool: &str, v: &[f64]) -> Row {
        let mut s = Samples::default();
        for x in v {
            s.push(*x);
        }
        Row {
            metric: metric.into(),
            tool: tool.into(),
            unit: Unit::Ms,
            samples: s,
            ratio: Ratio::None,
        }
    }

    #[test]
    fn svg_of_no_charted_metric_is_finite() {
        let s = svg(&[row("sshfs: full cycle on mount a", "x", &[1.0])]);
        assert!(s.trim_end().ends_with("</svg>") && s.len() < 10_000, "{s}");
    }

    #[test]
    fn outputs_are_well_formed() {
        let rows = vec![
            row("handoff", "flock(1) \"quoted\" <x>", &[1.0, 2.0, 3.0]),
            row("handoff", "locksmith f", &[0.3, 0.4, 0.5]),
            row(
                "handoff, dot-lock rivals",
                "lockfile-progs",
                &[4000.0, 5000.0],
            ),
        ];
        let j = json(&rows, "head", "today");
        assert!(j.contains(r#""tool": "flock(1) \"quoted\" <x>""#), "{j}");
        assert!(j.contains(r#""median": 2.0000"#), "{j}");
        let s = svg(&rows);
        assert!(s.starts_with("<svg") && s.trim_end().ends_with("</svg>"));
        assert!(s.contains("&lt;x&gt;") && !s.contains("<x>"));
        let m = markdown(&rows, "a line\n", "targets\n", &["a note".into()], "today");
        assert!(
            m.contains("## handoff\n") && m.contains("| locksmith f | 3 | 0.400 ms |"),
            "{m}"
        );
    }
}
