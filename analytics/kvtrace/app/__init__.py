"""The dashboard (``kvtrace app``, Streamlit): the entry file ``kvtrace_app.py`` declares
the navigation, each page in ``views/`` draws the shared sidebar (:mod:`kvtrace.app.sidebar`)
and is UI only. The helpers here compute no figure of their own: every number comes from
the library functions the CLI calls. Streamlit is imported by the pages, the sidebar and
the caches (:mod:`kvtrace.app.cached`) only: the trace sources (:mod:`kvtrace.app.sources`),
the launcher (:mod:`kvtrace.app.launcher`), the pages' choices and the sizing form import
without it."""
