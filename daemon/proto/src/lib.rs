//! `llamad-proto`: the byte layouts of llama.cpp's RPC protocol 7.0.0.
