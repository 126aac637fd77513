"""Course tooling: the labs' checks, the student-lab generator, the grader, the course catalog.

``checks`` (one module a lab: each exercise's feedback against an oracle), ``labgen``
(``python -m inferlab.course.labgen``: the student labs from the solved ones), the grader in the
order it works: ``grade`` (``python -m inferlab.course.grade``: workers, reports, the command
line), ``runner`` (one notebook executed in a fresh kernel), ``verify`` (the grader's own checks,
run in that kernel after the notebook finished), ``scan`` (what a submission's source rewrites)
and ``results`` (what grading comes to, and how an executed notebook is read); and ``catalog``
(pages, labs, exercises and hints, read from the repository for the grader and the guide).
"""
