//! A self-contained SVG of a run: key figures, deliveries per second over
//! time (with the ceiling as a dashed line), and latency percentiles as bars.
//! Hand-written SVG text, no plotting dependency.

use std::fmt::Write as _;

use super::report::Report;

const WIDTH: f64 = 900.0;
const HEIGHT: f64 = 640.0;

/// Escapes text for an SVG text node or attribute.
fn esc(text: &str) -> String {
    text.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

/// A "nice" upper bound for an axis: 1, 2 or 5 times a power of ten.
fn nice_max(value: f64) -> f64 {
    if value <= 0.0 {
        return 1.0;
    }
    let magnitude = 10f64.powf(value.log10().floor());
    [1.0, 2.0, 5.0, 10.0].iter().map(|m| m * magnitude).find(|v| *v >= value).unwrap_or(10.0 * magnitude)
}

pub fn render(report: &Report) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(s, r##"<rect x="0" y="0" width="{WIDTH}" height="{HEIGHT}" fill="#ffffff"/>"##);
    header(&mut s, report);
    throughput(&mut s, report, 60.0, 150.0, WIDTH - 100.0, 200.0);
    latency(&mut s, report, 60.0, 440.0, WIDTH - 100.0, 150.0);
    s.push_str("</svg>\n");
    s
}

fn header(s: &mut String, r: &Report) {
    let d = &r.deliveries;
    let verdict = if r.passed { "passed" } else { "FAILED" };
    let lines = [
        format!("fanout-loadtest: scenario {} ({verdict})", r.scenario),
        format!(
            "{} deliveries expected, {} delivered, {} missing, {} duplicates, {} attempts",
            d.expected, d.delivered, d.missing, d.duplicates, d.attempts
        ),
        format!(
            "{:.0} deliveries/s over {:.2} s{}{}",
            d.deliveries_per_second,
            d.seconds,
            r.ceiling
                .as_ref()
                .map(|c| format!("; ceiling {:.0} requests/s", c.requests_per_second))
                .unwrap_or_default(),
            r.ratio.map(|x| format!("; ratio {x:.2}")).unwrap_or_default()
        ),
        format!(
            "engine peak RSS {}, CPU {}; machine {} cores, {} MiB",
            r.resources.as_ref().map_or("n/a".into(), |x| format!("{:.0} MiB", x.peak_rss_mib)),
            r.resources.as_ref().map_or("n/a".into(), |x| format!("{:.1} s", x.cpu_seconds_total)),
            r.machine.nproc,
            r.machine.memory_mib
        ),
    ];
    for (i, line) in lines.iter().enumerate() {
        let (size, weight) = if i == 0 { (16, "bold") } else { (12, "normal") };
        let _ = writeln!(
            s,
            r#"<text x="20" y="{}" font-size="{size}" font-weight="{weight}">{}</text>"#,
            28 + i * 20,
            esc(line)
        );
    }
}

/// Deliveries per second as a line over the seconds of the run.
fn throughput(s: &mut String, r: &Report, x0: f64, y0: f64, w: f64, h: f64) {
    let series = &r.deliveries.per_second;
    let ceiling = r.ceiling.as_ref().map(|c| c.requests_per_second);
    let peak = series.iter().copied().max().unwrap_or(0) as f64;
    let y_max = nice_max(peak.max(ceiling.unwrap_or(0.0)));
    let x_max = series.len().max(1) as f64;
    let _ = writeln!(s, r#"<text x="{x0}" y="{}" font-weight="bold">Deliveries per second</text>"#, y0 - 10.0);
    axes(s, x0, y0, w, h, y_max, &format!("seconds since first publish (0..{})", series.len()));
    let px = |i: f64| x0 + w * i / x_max;
    let py = |v: f64| y0 + h - h * v / y_max;
    if !series.is_empty() {
        let points: Vec<String> =
            series.iter().enumerate().map(|(i, v)| format!("{:.1},{:.1}", px(i as f64 + 0.5), py(*v as f64))).collect();
        let _ =
            writeln!(s, r##"<polyline fill="none" stroke="#1f77b4" stroke-width="2" points="{}"/>"##, points.join(" "));
    }
    if let Some(c) = ceiling {
        let y = py(c);
        let _ = writeln!(
            s,
            r##"<line x1="{x0}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="#d62728" stroke-dasharray="6,4"/>"##,
            x0 + w
        );
        let _ = writeln!(
            s,
            r##"<text x="{:.1}" y="{:.1}" fill="#d62728" text-anchor="end">ceiling {c:.0}/s</text>"##,
            x0 + w,
            y - 4.0
        );
    }
}

/// Latency percentiles (ms) as labelled bars.
fn latency(s: &mut String, r: &Report, x0: f64, y0: f64, w: f64, h: f64) {
    let l = &r.deliveries.latency;
    let bars = [("p50", l.p50_ms), ("p90", l.p90_ms), ("p99", l.p99_ms), ("p99.9", l.p999_ms), ("max", l.max_ms)];
    let y_max = nice_max(l.max_ms);
    let _ = writeln!(
        s,
        r#"<text x="{x0}" y="{}" font-weight="bold">Publish-to-receiver latency, ms ({} deliveries)</text>"#,
        y0 - 10.0,
        l.count
    );
    axes(s, x0, y0, w, h, y_max, "percentile");
    let slot = w / bars.len() as f64;
    for (i, (name, value)) in bars.iter().enumerate() {
        let bh = h * value / y_max;
        let x = x0 + slot * i as f64 + slot * 0.2;
        let _ = writeln!(
            s,
            r##"<rect x="{x:.1}" y="{:.1}" width="{:.1}" height="{bh:.1}" fill="#2ca02c"/>"##,
            y0 + h - bh,
            slot * 0.6
        );
        let _ = writeln!(
            s,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{name}: {value:.1}</text>"#,
            x + slot * 0.3,
            y0 + h - bh - 4.0
        );
    }
}

/// A frame with the y axis labelled 0, half, max and an x axis caption.
fn axes(s: &mut String, x0: f64, y0: f64, w: f64, h: f64, y_max: f64, x_caption: &str) {
    let _ = writeln!(s, r##"<rect x="{x0}" y="{y0}" width="{w}" height="{h}" fill="none" stroke="#888888"/>"##);
    for (frac, value) in [(0.0, 0.0), (0.5, y_max / 2.0), (1.0, y_max)] {
        let y = y0 + h - h * frac;
        let _ = writeln!(s, r##"<line x1="{x0}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="#eeeeee"/>"##, x0 + w);
        let _ = writeln!(s, r#"<text x="{:.1}" y="{:.1}" text-anchor="end">{value}</text>"#, x0 - 4.0, y + 4.0);
    }
    let _ = writeln!(
        s,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
        x0 + w / 2.0,
        y0 + h + 16.0,
        esc(x_caption)
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::run::collector::{Percentiles, Summary};
    use crate::run::report::*;

    /// A small XML well-formedness check: balanced tags, quoted attributes,
    /// no stray `<` or `&` in text.
    fn check_well_formed(xml: &str) -> Result<(), String> {
        let mut stack: Vec<String> = Vec::new();
        let mut rest = xml;
        while let Some(open) = rest.find('<') {
            let text = &rest[..open];
            if text.contains('>')
                || text.replace("&amp;", "").replace("&lt;", "").replace("&gt;", "").replace("&quot;", "").contains('&')
            {
                return Err(format!("bad text {text:?}"));
            }
            let close = rest[open..].find('>').ok_or("unclosed tag")? + open;
            let tag = &rest[open + 1..close];
            if tag.contains('<') {
                return Err(format!("'<' inside tag {tag:?}"));
            }
            if !tag.matches('"').count().is_multiple_of(2) {
                return Err(format!("unbalanced quotes in {tag:?}"));
            }
            if let Some(name) = tag.strip_prefix('/') {
                match stack.pop() {
                    Some(open_name) if open_name == name.trim() => {}
                    other => return Err(format!("</{name}> closes {other:?}")),
                }
            } else if !tag.ends_with('/') {
                stack.push(tag.split_whitespace().next().unwrap_or("").to_string());
            }
            rest = &rest[close + 1..];
        }
        if !rest.trim().is_empty() || !stack.is_empty() {
            return Err(format!("unclosed: {stack:?}"));
        }
        Ok(())
    }

    fn report() -> Report {
        Report {
            scenario: "t<&>\"".into(),
            description: String::new(),
            passed: true,
            failures: vec![],
            started_at_unix: 0,
            run_seconds: 1.0,
            command: String::new(),
            machine: Machine::default(),
            engine: EngineInfo::default(),
            plan: PlanInfo::default(),
            setup: Default::default(),
            publish: Default::default(),
            deliveries: Summary {
                expected: 10,
                delivered: 10,
                missing: 0,
                duplicates: 0,
                attempts: 10,
                unexpected: 0,
                unacknowledged: 0,
                bad_signatures: 0,
                statuses: Default::default(),
                seconds: 2.0,
                deliveries_per_second: 5.0,
                latency: Percentiles {
                    count: 10,
                    p50_ms: 1.0,
                    p90_ms: 2.0,
                    p99_ms: 3.0,
                    p999_ms: 4.0,
                    max_ms: 5.0,
                    mean_ms: 1.5,
                },
                per_second: vec![4, 6],
                duplicates_per_second: vec![],
                missing_examples: vec![],
            },
            resources: None,
            engine_metrics: Default::default(),
            deliveries_by_outcome: Default::default(),
            profile: None,
            cql_ceiling: None,
            ratio_cql: None,
            ceiling: Some(Default::default()),
            ratio: Some(0.5),
            h2load: None,
            ratio_h2load: None,
            apns_server: None,
            pushy: None,
            ratio_pushy: None,
            windows: Default::default(),
            wire: None,
            nodes: None,
            db_fault: None,
        }
    }

    #[test]
    fn svg_is_well_formed() {
        let svg = render(&report());
        check_well_formed(&svg).unwrap();
        assert!(svg.starts_with("<svg xmlns=\"http://www.w3.org/2000/svg\""));
        assert!(svg.contains("polyline"));
        assert!(svg.contains("t&lt;&amp;&gt;&quot;"), "the scenario name is escaped");
        // Empty series and zero latencies still render.
        let mut empty = report();
        empty.deliveries.per_second.clear();
        empty.deliveries.latency = Percentiles::default();
        check_well_formed(&render(&empty)).unwrap();
        // The checker itself rejects broken XML.
        assert!(check_well_formed("<svg><g></svg>").is_err());
        assert!(check_well_formed("<svg>a < b</svg>").is_err());
    }

    #[test]
    fn nice_axis_bounds() {
        assert_eq!(nice_max(0.0), 1.0);
        assert_eq!(nice_max(7.0), 10.0);
        assert_eq!(nice_max(12.0), 20.0);
        assert_eq!(nice_max(4500.0), 5000.0);
    }
}
