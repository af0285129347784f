//! Medians and ranges, and the plain-text table.

use std::fmt::Write as _;

/// What a row's numbers are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unit {
    /// Durations, stored in milliseconds.
    Ms,
    /// Memory, stored in MiB.
    MiB,
    /// Counts (context switches over the window).
    Count,
}

/// The samples of one tool for one metric.
#[derive(Clone, Debug, Default)]
pub struct Samples(Vec<f64>);

impl Samples {
    pub fn push(&mut self, v: f64) {
        self.0.push(v);
    }

    pub fn values(&self) -> &[f64] {
        &self.0
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    fn sorted(&self) -> Vec<f64> {
        let mut v = self.0.clone();
        v.sort_by(f64::total_cmp);
        v
    }

    pub fn median(&self) -> f64 {
        let v = self.sorted();
        match v.len() {
            0 => f64::NAN,
            n if n % 2 == 1 => v[n / 2],
            n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
        }
    }

    pub fn min(&self) -> f64 {
        self.sorted().first().copied().unwrap_or(f64::NAN)
    }

    pub fn max(&self) -> f64 {
        self.sorted().last().copied().unwrap_or(f64::NAN)
    }
}

/// One line of the table.
#[derive(Clone, Debug)]
pub struct Row {
    pub metric: String,
    pub tool: String,
    pub unit: Unit,
    pub samples: Samples,
    pub ratio: Ratio,
}

/// The last column of a row.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Ratio {
    /// This row is the reference of its metric.
    IsReference,
    /// This row's median divided by the reference median given.
    Vs(f64),
    /// No meaningful ratio (context rows).
    None,
}

impl Row {
    pub fn ratio(&self) -> Option<f64> {
        match self.ratio {
            Ratio::Vs(r) => Some(self.samples.median() / r),
            _ => None,
        }
    }
}

pub fn fmt_value(v: f64, unit: Unit) -> String {
    match unit {
        Unit::Ms if v.is_nan() => "-".into(),
        Unit::Ms if v >= 100.0 => format!("{v:.0} ms"),
        Unit::Ms if v >= 10.0 => format!("{v:.1} ms"),
        Unit::Ms => format!("{v:.3} ms"),
        Unit::MiB => format!("{v:.2} MiB"),
        Unit::Count => format!("{v:.0}"),
    }
}

fn fmt_range(s: &Samples, unit: Unit) -> String {
    let (lo, hi) = (fmt_value(s.min(), unit), fmt_value(s.max(), unit));
    match unit {
        Unit::Ms => format!(
            "{} – {}",
            lo.trim_end_matches(" ms"),
            hi.trim_end_matches(" ms")
        ),
        Unit::MiB => format!(
            "{} – {}",
            lo.trim_end_matches(" MiB"),
            hi.trim_end_matches(" MiB")
        ),
        Unit::Count => format!("{lo} – {hi}"),
    }
}

/// Renders rows as an aligned plain-text table; the metric name is shown once per group.
pub fn table(rows: &[Row]) -> String {
    let header = ["metric", "tool", "n", "median", "min – max", "ratio"];
    let mut cells: Vec<[String; 6]> = Vec::new();
    let mut last_metric = String::new();
    for r in rows {
        let metric = if r.metric == last_metric {
            String::new()
        } else {
            r.metric.clone()
        };
        last_metric = r.metric.clone();
        cells.push([
            metric,
            r.tool.clone(),
            r.samples.len().to_string(),
            fmt_value(r.samples.median(), r.unit),
            fmt_range(&r.samples, r.unit),
            match r.ratio {
                Ratio::IsReference => "ref".into(),
                Ratio::Vs(_) => r.ratio().map_or("-".into(), |x| format!("{x:.2}×")),
                Ratio::None => "-".into(),
            },
        ]);
    }
    let mut width = header.map(|h| h.chars().count());
    for c in &cells {
        for (w, s) in width.iter_mut().zip(c.iter()) {
            *w = (*w).max(s.chars().count());
        }
    }
    let mut out = String::new();
    let line = |out: &mut String, c: &[String; 6], first_of_group: bool| {
        if first_of_group && !out.is_empty() {
            out.push('\n');
        }
        for (i, (s, w)) in c.iter().zip(width.iter()).enumerate() {
            let pad = w - s.chars().count();
            // Numbers right-aligned, words left-aligned.
            if (2..=5).contains(&i) {
                let _ = write!(out, "{}{s}  ", " ".repeat(pad));
            } else {
                let _ = write!(out, "{s}{}  ", " ".repeat(pad));
            }
        }
        let trimmed = out.trim_end().len();
        out.truncate(trimmed);
        out.push('\n');
    };
    line(&mut out, &header.map(String::from), false);
    let rule: [String; 6] = width.map(|w| "-".repeat(w));
    line(&mut out, &rule, false);
    for (i, c) in cells.iter().enumerate() {
        line(&mut out, c, i > 0 && !c[0].is_empty());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_odd_even() {
        let mut s = Samples::default();
        for v in [3.0, 1.0, 2.0] {
            s.push(v);
        }
        assert_eq!(s.median(), 2.0);
        s.push(10.0);
        assert_eq!(s.median(), 2.5);
        assert_eq!(s.min(), 1.0);
        assert_eq!(s.max(), 10.0);
    }
}
