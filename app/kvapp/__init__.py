"""UI helpers shared by the dashboard's pages: the sidebar (trace source, model, GPU),
the Streamlit caches around kvtrace's analysis functions, formatting and Altair charts.
Computation stays in :mod:`kvtrace`; nothing here computes a figure of its own."""
