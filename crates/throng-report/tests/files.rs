//! Result files on disk: written as they go, read back up to damage, and
//! refused when they are not result files.

use std::collections::BTreeMap;
use std::io::Write as _;

use throng_report::format::{
    Event, Header, ReadError, Reader, Record, Writer, encode_interval, read_files,
};
use throng_report::interval::{Interval, new_histogram};
use throng_testkit::TempDir;

fn interval(second: u64, source: &str, seed: u64) -> Interval {
    let mut h = new_histogram();
    for i in 0..100 {
        h.record(1 + (i * 37 + seed * 11) % 5_000).unwrap();
    }
    Interval {
        start_ns: second * 1_000_000_000,
        length_ns: 1_000_000_000,
        source: source.to_owned(),
        counters: BTreeMap::from([("messages.received".to_owned(), 100 + seed)]),
        gauges: BTreeMap::from([("connections.open".to_owned(), 50)]),
        peaks: BTreeMap::new(),
        histograms: BTreeMap::from([("delivery".to_owned(), h)]),
        host: None,
    }
}

fn header() -> Header {
    Header::new(
        vec!["throng".into(), "hold".into()],
        serde_json::json!({"connections": 100}),
    )
}

#[test]
fn what_is_written_is_read_back_in_order() {
    let dir = TempDir::new("report-roundtrip");
    let path = dir.file("run.throng");
    let mut w = Writer::create(&path, &header()).unwrap();
    let written: Vec<Interval> = (0..5)
        .map(|s| interval(1_000 + s, "box/hold-0", s))
        .collect();
    for iv in &written[..3] {
        w.write_interval(iv).unwrap();
    }
    let ev = Event {
        at_ns: 1,
        source: "box/hold".into(),
        kind: "worker.restarted".into(),
        text: "worker 0 exited: signal 9".into(),
    };
    w.write_event(&ev).unwrap();
    // Lines from a worker's pipe, as the supervisor appends them.
    for iv in &written[3..] {
        w.write_encoded(&format!("{}\n", encode_interval(iv)))
            .unwrap();
    }
    assert!(w.write_encoded("{}\n{}").is_err());
    drop(w);

    let mut reader = Reader::open(&path).unwrap();
    assert_eq!(reader.header().command, vec!["throng", "hold"]);
    let records: Vec<Record> = reader.by_ref().collect();
    assert!(reader.damage().is_none());
    let mut expected: Vec<Record> = written[..3].iter().cloned().map(Record::Interval).collect();
    expected.push(Record::Event(ev));
    expected.extend(written[3..].iter().cloned().map(Record::Interval));
    assert_eq!(records, expected);
    assert_eq!(reader.records_read(), 7);
}

#[test]
fn a_truncated_file_reads_its_complete_prefix_and_says_where() {
    let dir = TempDir::new("report-truncated");
    let path = dir.file("cut.throng");
    let mut w = Writer::create(&path, &header()).unwrap();
    for s in 0..4 {
        w.write_interval(&interval(2_000 + s, "box/hold-0", s))
            .unwrap();
    }
    drop(w);
    let full = std::fs::read(&path).unwrap();
    // Cut inside the last record, as a kill during a write would.
    let last_start = full[..full.len() - 1]
        .iter()
        .rposition(|b| *b == b'\n')
        .unwrap()
        + 1;
    let cut = last_start + (full.len() - last_start) / 2;
    std::fs::write(&path, &full[..cut]).unwrap();

    let mut reader = Reader::open(&path).unwrap();
    let n = reader.by_ref().count();
    assert_eq!(n, 3);
    let damage = reader.damage().expect("damage reported").clone();
    assert_eq!(damage.offset, last_start as u64);
    assert_eq!(damage.line, 5);
    assert_eq!(damage.records_before, 4);
    let text = damage.to_string();
    assert!(text.contains("cut.throng"), "{text}");
    assert!(text.contains(&format!("byte {last_start}")), "{text}");
    assert!(text.contains("incomplete"), "{text}");
}

#[test]
fn garbage_in_the_middle_stops_there() {
    let dir = TempDir::new("report-garbage");
    let path = dir.file("bad.throng");
    let mut w = Writer::create(&path, &header()).unwrap();
    w.write_interval(&interval(3_000, "box/hold-0", 1)).unwrap();
    drop(w);
    let good_len = std::fs::metadata(&path).unwrap().len();
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(&path)
        .unwrap();
    f.write_all(b"\0\0\0\0\n").unwrap();
    f.write_all(encode_interval(&interval(3_001, "box/hold-0", 2)).as_bytes())
        .unwrap();
    f.write_all(b"\n").unwrap();
    drop(f);
    let mut reader = Reader::open(&path).unwrap();
    assert_eq!(reader.by_ref().count(), 1);
    assert_eq!(reader.damage().unwrap().offset, good_len);
}

#[test]
fn files_that_are_not_results_are_refused_clearly() {
    let dir = TempDir::new("report-foreign");
    let cases: [(&str, &[u8], &str); 5] = [
        ("empty", b"", "empty"),
        ("text", b"hello world\n", "not JSON"),
        ("json", b"{\"a\":1}\n", "\"throng\":\"results\""),
        ("binary", b"\x89PNG\r\n\x1a\n\0\0\0", "not UTF-8"),
        (
            "cut-header",
            b"{\"throng\":\"results\",\"vers",
            "incomplete",
        ),
    ];
    for (name, bytes, why) in cases {
        let path = dir.file(name);
        std::fs::write(&path, bytes).unwrap();
        let err = Reader::open(&path).unwrap_err();
        assert!(matches!(err, ReadError::NotResults { .. }), "{name}: {err}");
        let text = err.to_string();
        assert!(text.contains(name), "{text}");
        assert!(text.contains("not a throng result file"), "{text}");
        assert!(text.contains(why), "{name}: {text}");
    }
    let newer = dir.file("newer");
    std::fs::write(&newer, b"{\"throng\":\"results\",\"version\":7}\n").unwrap();
    let err = Reader::open(&newer).unwrap_err();
    assert!(err.to_string().contains("newer"), "{err}");
    let missing = Reader::open(dir.file("nope")).unwrap_err();
    assert!(matches!(missing, ReadError::Io { .. }), "{missing}");
}

#[test]
fn read_files_visits_every_file_and_keeps_damage_per_file() {
    let dir = TempDir::new("report-many");
    let a = dir.file("a");
    let b = dir.file("b");
    let mut w = Writer::create(&a, &header()).unwrap();
    w.write_interval(&interval(1, "a/hold-0", 1)).unwrap();
    drop(w);
    let mut w = Writer::create(&b, &header()).unwrap();
    w.write_interval(&interval(1, "b/hold-0", 1)).unwrap();
    drop(w);
    let mut bytes = std::fs::read(&b).unwrap();
    bytes.extend_from_slice(b"{\"type\":\"interval\"");
    std::fs::write(&b, bytes).unwrap();
    let mut seen = vec![];
    let summaries = read_files(&[&a, &b], |i, r| seen.push((i, r))).unwrap();
    // Each file's header, then its records.
    assert_eq!(seen.len(), 4);
    assert!(matches!(seen[0].1, Record::Header(_)));
    assert_eq!((seen[1].0, seen[3].0), (0, 1));
    assert!(summaries[0].damage.is_none());
    assert!(summaries[1].damage.is_some());
}

#[test]
fn runs_appended_to_one_file_read_as_one() {
    let dir = TempDir::new("report-append");
    let path = dir.file("runs.throng");
    let mut w = Writer::append(&path, &header()).unwrap();
    w.write_interval(&interval(10, "box/hold-0", 1)).unwrap();
    drop(w);
    let mut w = Writer::append(&path, &header()).unwrap();
    w.write_interval(&interval(20, "box/hold-0", 2)).unwrap();
    drop(w);
    let records: Vec<Record> = Reader::open(&path).unwrap().collect();
    assert_eq!(records.len(), 3);
    assert!(matches!(records[1], Record::Header(_)));
    assert_eq!(records[2], Record::Interval(interval(20, "box/hold-0", 2)));
}

mod merging {
    use super::*;
    use throng_host::sample::HostSample;
    use throng_report::merge::merge_files;
    use throng_report::summary::Report;

    fn with_host(mut iv: Interval, host: &str, at_s: u64, estab: u64) -> Interval {
        iv.host = Some(HostSample {
            host: host.to_owned(),
            at_ns: at_s * 1_000_000_000,
            tcp_established: estab,
            packets_in_total: at_s * 1000,
            bytes_in_total: at_s * 1_000_000,
            mem_total_bytes: 8 << 30,
            mem_available_bytes: 4 << 30,
            ..HostSample::default()
        });
        iv
    }

    /// Two workers on two hosts over 20 s, with host samples from one process per host.
    fn run() -> Vec<Interval> {
        let mut all = vec![];
        for s in 0..20 {
            all.push(with_host(
                interval(5_000 + s, "a/hold-0", s),
                "a",
                5_001 + s,
                10 + s,
            ));
            all.push(interval(5_000 + s, "a/hold-1", s + 100));
            all.push(with_host(
                interval(5_000 + s, "b/hold-0", s + 7),
                "b",
                5_001 + s,
                1000,
            ));
        }
        all
    }

    #[test]
    fn two_files_merge_exactly_as_one() {
        let dir = TempDir::new("report-merge");
        let one = dir.file("one");
        let a = dir.file("a");
        let b = dir.file("b");
        let mut w1 = Writer::create(&one, &header()).unwrap();
        let mut wa = Writer::create(&a, &header()).unwrap();
        let mut wb = Writer::create(&b, &header()).unwrap();
        for (i, iv) in run().iter().enumerate() {
            w1.write_interval(iv).unwrap();
            // Split unevenly, and not by source: a file may hold any mix.
            if i % 3 == 0 { &mut wa } else { &mut wb }
                .write_interval(iv)
                .unwrap();
        }
        drop((w1, wa, wb));

        for width in [1_000_000_000, 10_000_000_000] {
            let (single, _) = merge_files(&[&one], width).unwrap();
            let (split, files) = merge_files(&[&b, &a], width).unwrap();
            assert_eq!(files.len(), 2);
            assert_eq!(single, split);
            let r1 = Report::build(&single, &[], true);
            let r2 = Report::build(&split, &[], true);
            assert_eq!(r1, r2);
        }

        let (m, _) = merge_files(&[&a, &b], 1_000_000_000).unwrap();
        // The merged histogram is the sum of every interval's histogram.
        let mut expected = new_histogram();
        for iv in run() {
            expected.add(&iv.histograms["delivery"]).unwrap();
        }
        assert_eq!(m.histograms["delivery"], expected);
        assert_eq!(
            m.counters["messages.received"],
            run()
                .iter()
                .map(|iv| iv.counters["messages.received"])
                .sum::<u64>()
        );
        let r = Report::build(&m, &[], true);
        assert_eq!(r.gauges["connections.open"].last, 150);
        assert_eq!(r.duration_s, 20.0);
        let host = r.host.unwrap();
        // Host a's last sample (29) plus host b's, each once.
        assert_eq!(host.tcp_established_last, 29 + 1000);
        assert_eq!(host.packets_in_per_s, 2000.0);
        let series = r.series.unwrap();
        assert_eq!(series.len(), 20);
        assert_eq!(series[0].host.as_ref().unwrap().packets_in_per_s, None);
        assert_eq!(
            series[1].host.as_ref().unwrap().packets_in_per_s,
            Some(2000.0)
        );
    }

    #[test]
    fn concatenated_files_merge_as_the_files_do() {
        let dir = TempDir::new("report-cat");
        let (a, b, cat) = (dir.file("a"), dir.file("b"), dir.file("cat"));
        let mut wa = Writer::create(&a, &header()).unwrap();
        let mut wb = Writer::create(&b, &header()).unwrap();
        for (i, iv) in run().iter().enumerate() {
            if i % 2 == 0 { &mut wa } else { &mut wb }
                .write_interval(iv)
                .unwrap();
        }
        drop((wa, wb));
        let mut joined = std::fs::read(&a).unwrap();
        joined.extend(std::fs::read(&b).unwrap());
        std::fs::write(&cat, joined).unwrap();
        let (two, _) = merge_files(&[&a, &b], 1_000_000_000).unwrap();
        let (one, files) = merge_files(&[&cat], 1_000_000_000).unwrap();
        assert_eq!(one, two);
        assert!(files[0].damage.is_none());
    }

    #[test]
    fn the_same_file_twice_is_counted_once() {
        let dir = TempDir::new("report-twice");
        let one = dir.file("one");
        let mut w = Writer::create(&one, &header()).unwrap();
        for iv in run() {
            w.write_interval(&iv).unwrap();
        }
        drop(w);
        let (once, _) = merge_files(&[&one], 1_000_000_000).unwrap();
        let (twice, _) = merge_files(&[&one, &one], 1_000_000_000).unwrap();
        assert_eq!(twice.duplicates, 60);
        assert_eq!(once.histograms, twice.histograms);
        assert_eq!(once.counters, twice.counters);
        assert_eq!(once.buckets, twice.buckets);
    }
}
