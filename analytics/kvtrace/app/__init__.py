"""The dashboard (``kvtrace app``, Streamlit): the entry file ``kvtrace_app.py`` declares
the navigation, each page in ``views/`` draws the shared sidebar (:mod:`kvtrace.app.sidebar`)
and is UI only. The helpers here (sidebar, Streamlit caches, formats, charts) compute no
figure of their own: every number comes from the library functions the CLI calls."""
