//! The memory plot: memory in use over steps, drawn from the trace, so the sawtooth of
//! gradient accumulation (activations building up over a micro-step's forward, released by
//! its backward) and each OOM recovery can be seen.

use std::path::Path;

use plotters::prelude::*;
use plotters::style::FontStyle;

use crate::memory::{Event, Trace};

/// DejaVu Sans Mono (Bitstream Vera license, assets/DejaVuSansMono.LICENSE), embedded so the
/// plot has its labels on machines without fonts.
const FONT: &[u8] = include_bytes!("../assets/DejaVuSansMono.ttf");

pub fn write_png(trace: &Trace, title: &str, path: &Path) -> Result<(), String> {
    plotters::style::register_font("sans-serif", FontStyle::Normal, FONT)
        .map_err(|_| "the embedded font could not be read".to_string())?;
    if trace.rows.is_empty() {
        return Err("the trace is empty: no step ran".into());
    }
    let cuda = trace.rows[0].reading.allocator.is_some();
    let series = Series::of(trace);
    let x_end = trace.rows.last().map_or(1.0, |r| r.step as f64 + 1.0);
    let x_start = trace.rows[0].step as f64;
    let y_max = series
        .in_use
        .iter()
        .chain(&series.reserved)
        .map(|&(_, y)| y)
        .fold(1.0f64, f64::max)
        * 1.1;
    draw(path, title, cuda, &series, x_start..x_end, y_max).map_err(|e| e.to_string())
}

/// What is plotted, in MiB over steps.
struct Series {
    in_use: Vec<(f64, f64)>,
    /// What the caching allocator holds from the driver (CUDA only).
    reserved: Vec<(f64, f64)>,
    /// Where an out-of-memory error was recovered from.
    ooms: Vec<f64>,
}

impl Series {
    fn of(trace: &Trace) -> Series {
        let xs = step_positions(trace);
        let mib = |bytes: u64| bytes as f64 / (1024.0 * 1024.0);
        let in_use = trace
            .rows
            .iter()
            .zip(&xs)
            .map(|(r, &x)| (x, mib(r.in_use())))
            .collect();
        let reserved = trace
            .rows
            .iter()
            .zip(&xs)
            .filter_map(|(r, &x)| Some((x, mib(r.reading.allocator?.reserved_bytes.max(0) as u64))))
            .collect();
        let ooms = trace
            .rows
            .iter()
            .zip(&xs)
            .filter(|(r, _)| r.event == Event::OutOfMemory)
            .map(|(_, &x)| x)
            .collect();
        Series {
            in_use,
            reserved,
            ooms,
        }
    }
}

/// Each row's place on the step axis: rows in recording order, spread evenly over their step
/// (a redone step's attempts follow one another within it).
fn step_positions(trace: &Trace) -> Vec<f64> {
    let mut xs = Vec::with_capacity(trace.rows.len());
    let mut first = 0;
    while first < trace.rows.len() {
        let step = trace.rows[first].step;
        let count = trace.rows[first..]
            .iter()
            .take_while(|r| r.step == step)
            .count();
        for i in 0..count {
            xs.push(step as f64 + (i as f64 + 1.0) / count as f64);
        }
        first += count;
    }
    xs
}

fn draw(
    path: &Path,
    title: &str,
    cuda: bool,
    series: &Series,
    x: std::ops::Range<f64>,
    y_max: f64,
) -> Result<(), Box<dyn std::error::Error>> {
    let y_min = 0.0;
    let root = BitMapBackend::new(path, (1200, 600)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(x, y_min..y_max)?;
    chart
        .configure_mesh()
        .x_desc("optimizer step")
        .y_desc("MiB")
        .label_style(("sans-serif", 14))
        .draw()?;
    let label = if cuda {
        "allocated (caching allocator)"
    } else {
        "allocated (host tensors)"
    };
    chart
        .draw_series(LineSeries::new(
            series.in_use.iter().copied(),
            BLUE.stroke_width(2),
        ))?
        .label(label)
        .legend(|(x, y)| PathElement::new([(x, y), (x + 20, y)], BLUE.stroke_width(2)));
    if !series.reserved.is_empty() {
        chart
            .draw_series(LineSeries::new(
                series.reserved.iter().copied(),
                GREEN.stroke_width(2),
            ))?
            .label("reserved (caching allocator)")
            .legend(|(x, y)| PathElement::new([(x, y), (x + 20, y)], GREEN.stroke_width(2)));
    }
    if !series.ooms.is_empty() {
        chart
            .draw_series(series.ooms.iter().map(|&x| {
                PathElement::new([(x, y_min), (x, y_max)], RED.mix(0.6).stroke_width(2))
            }))?
            .label("out of memory: micro-batch halved, step redone")
            .legend(|(x, y)| PathElement::new([(x, y), (x + 20, y)], RED.stroke_width(2)));
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font(("sans-serif", 14))
        .draw()?;
    root.present()?;
    Ok(())
}
