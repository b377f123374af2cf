//! The admin API's request bodies: the first byte picks a request type, the rest is its JSON body
//! (what axum's `Json` extractor hands to serde_json). A body that parses must serialize and parse
//! back to the same value.
#![no_main]

use libfuzzer_sys::fuzz_target;
use llamad_api::cache::{CacheListQuery, ImportRequest, VerifyRequest};
use llamad_api::jobs::JobSubmit;
use llamad_api::workers::WorkerAdd;

fn check<T>(body: &[u8])
where
    T: serde::de::DeserializeOwned + serde::Serialize + PartialEq + std::fmt::Debug,
{
    let Ok(v) = serde_json::from_slice::<T>(body) else { return };
    let text = serde_json::to_vec(&v).expect("a parsed value serializes");
    let back: T = serde_json::from_slice(&text).expect("a serialized value parses");
    assert_eq!(back, v);
}

fuzz_target!(|data: &[u8]| {
    let Some((&which, body)) = data.split_first() else { return };
    match which % 5 {
        0 => check::<JobSubmit>(body),
        1 => check::<WorkerAdd>(body),
        2 => check::<VerifyRequest>(body),
        3 => check::<ImportRequest>(body),
        _ => check::<CacheListQuery>(body),
    }
    if let Ok(s) = std::str::from_utf8(body) {
        let _ = s.parse::<cachestore::Digest>();
    }
});
