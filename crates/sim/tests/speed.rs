//! The null core's event rate (the release build's figure is in the README).

#[test]
fn null_core_events_per_sec_is_measured() {
    let rate = virga_sim::null_core_events_per_sec(8, 2_000_000);
    println!("null core: {rate:.0} events/s");
    assert!(rate > 100_000.0, "{rate:.0} events/s");
}
